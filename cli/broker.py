"""``bolide broker`` (an embedded broker in the foreground) and ``bolide fetch`` (its jars).

Exit codes: 0 ok, 1 runtime failure, 2 usage error.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from typing import Any

from bolide.facade.broker import GROUP_SETTINGS, EmbeddedBroker, port_taken
from bolide.facade.broker.jars import KAFKA, Artifacts, fetch

__all__ = ["register"]

#: The port ``bolide broker`` prefers, as Kafka's own scripts do.
_DEFAULT_PORT = 9092


def _broker(args: argparse.Namespace) -> int:
    port = args.port
    if port is None:
        port = None if port_taken(_DEFAULT_PORT) else _DEFAULT_PORT
        if port is None:
            print(f"port {_DEFAULT_PORT} is taken; using a free port", file=sys.stderr)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    broker = EmbeddedBroker(
        engine=args.engine,
        brokers=args.brokers,
        port=port,
        log_path=args.log,
        group_settings=args.group_settings,
    )
    print(f"starting the embedded {broker.engine} broker ...", file=sys.stderr, flush=True)
    with broker:
        nodes = len(broker.node_ids)
        print(
            f"{broker.engine} broker ({nodes} node{'s' if nodes > 1 else ''}) listening on "
            f"{broker.bootstrap_servers} (log: {broker.log_path})"
        )
        print(f"export BOLIDE_BOOTSTRAP={broker.bootstrap_servers}", flush=True)
        gap_ms = broker.cluster().fetch_gap_settle_ms
        if gap_ms:  # Tansu: ends and skipped offsets must be confirmed (docs/compatibility.md)
            print(
                f"{broker.engine} engine: pass -X fetch_gap_settle_ms={gap_ms} to bolide commands",
                file=sys.stderr,
                flush=True,
            )
        try:
            while not stop.wait(0.5):
                if not broker.running:
                    print("broker exited; see its log", file=sys.stderr)
                    return 1
        except KeyboardInterrupt:
            pass
    return 0


def _fetchable() -> dict[str, Artifacts]:
    found = {KAFKA.name: KAFKA}
    try:
        from bolide.spark.connector import SPARK_KAFKA
    except ImportError:  # bolide.spark without the spark extra
        return found
    found[SPARK_KAFKA.name] = SPARK_KAFKA
    return found


def _fetch(args: argparse.Namespace) -> int:
    known = _fetchable()
    names = args.names or list(known)
    for name in names:
        if name not in known:
            args.parser.error(f"unknown jar set {name!r}; choose from {', '.join(known)}")
    for name in names:
        artifacts = known[name]
        jars = fetch(artifacts, force=args.force, quiet=not args.verbose)
        print(f"{name} {artifacts.version}: {len(jars)} jars in {artifacts.folder}")
    return 0


def register(sub: Any) -> None:
    """Add ``broker`` and ``fetch``."""
    broker = sub.add_parser(
        "broker",
        help="run an embedded broker in the foreground",
        description="Run an embedded broker until interrupted: Apache Kafka (KRaft) or Tansu.",
    )
    broker.add_argument(
        "--engine",
        choices=("auto", "kafka", "tansu"),
        default="auto",
        help="kafka: Apache Kafka (needs Java 17+ and `bolide fetch kafka`); tansu: the light "
        "engine; auto (default): kafka when it can run, else tansu",
    )
    broker.add_argument(
        "--brokers", type=int, default=1, metavar="N", help="number of nodes (kafka only)"
    )
    broker.add_argument(
        "--port", type=int, default=None, help="client port (default 9092, or a free one if taken)"
    )
    broker.add_argument("--log", default=None, help="broker log file (default: a temp file)")
    broker.add_argument(
        "--group-settings",
        choices=GROUP_SETTINGS,
        default="fast",
        help="fast (default): group timeouts shortened for development (a 500 ms session "
        "floor, no initial rebalance delay); stock: Apache Kafka's own defaults, as a "
        "production cluster runs them (kafka only)",
    )
    broker.set_defaults(func=_broker, parser=broker)

    fetch_parser = sub.add_parser(
        "fetch",
        help="fetch the Java jars of the Kafka engine and Spark's Kafka connector",
        description="Copy jars from Maven Central into the user cache ($BOLIDE_CACHE, default "
        "~/.cache/bolide) with Maven; jars already there are kept.",
    )
    fetch_parser.add_argument(
        "names", nargs="*", metavar="NAME", help="kafka, spark-kafka (default: all)"
    )
    fetch_parser.add_argument("--force", action="store_true", help="fetch again")
    fetch_parser.set_defaults(func=_fetch, parser=fetch_parser)
