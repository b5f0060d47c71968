"""``bolide spark archive|resequence|query``: thin shims over ``bolide.spark.jobs``.

Exit codes: 0 ok, 1 runtime failure, 2 usage error. ``spark-submit`` runs this file directly
(``spark-submit [options] path/to/bolide/cli/spark.py archive --master submit ...``).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from typing import Any

from bolide.cli.common import add_cluster_arguments, add_db_argument, cluster_from_args

# Without the spark extra this import fails on PySpark, and the command group is left out.
from bolide.spark.jobs import archive, query, resequence
from bolide.spark.session import spark_session

__all__ = ["register"]


def _conf_pair(text: str) -> tuple[str, str]:
    """One ``--conf key=value``, split at the first ``=`` (as ``spark-submit`` does)."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected key=value, got {text!r}")
    return key.strip(), value


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--master",
        default="local[2]",
        help="Spark master URL: local[N], spark://host:7077, k8s://..., yarn (default "
        "local[2]); 'submit' leaves it to spark-submit",
    )
    parser.add_argument(
        "--deploy-mode",
        choices=("client", "cluster"),
        default="client",
        help="where the driver runs: client (here, the default); cluster mode needs "
        "spark-submit --deploy-mode cluster with --master submit",
    )
    parser.add_argument(
        "--conf",
        action="append",
        type=_conf_pair,
        default=[],
        metavar="KEY=VALUE",
        help="a Spark setting, as spark-submit's --conf (repeatable); it overrides bolide's",
    )
    parser.add_argument(
        "--packages",
        action="append",
        default=[],
        metavar="COORDS",
        help="Maven coordinates for spark.jars.packages (repeatable), e.g. the Kafka connector",
    )


def _source(parser: argparse.ArgumentParser) -> None:
    add_cluster_arguments(parser)
    parser.add_argument("--stream", required=True, help="stream (topic) to read")
    parser.add_argument("--checkpoint", required=True, help="Spark checkpoint directory")
    parser.add_argument(
        "--source",
        choices=("auto", "bolide", "kafka"),
        default="auto",
        help="Spark's Kafka connector (kafka), format('bolide') (no jar), or auto (default): "
        "the connector when the session has it",
    )
    parser.add_argument(
        "--starting-offsets",
        default="earliest",
        help="where a new checkpoint starts: earliest (default), latest or Spark's JSON",
    )


def register(subparsers: Any) -> None:
    """Add ``spark`` and its jobs to the ``bolide`` command line."""
    spark = subparsers.add_parser(
        "spark",
        help="run bolide's Spark jobs (archive, resequence, query)",
        description="Structured Streaming and Spark SQL jobs over bolide streams.",
    )
    jobs = spark.add_subparsers(dest="spark_job", metavar="JOB", required=True)

    archive = jobs.add_parser(
        "archive",
        help="archive a stream into the SQL history with Structured Streaming",
        description="Copy a stream into the history store; idempotent per batch, so a "
        "restart from the same checkpoint neither loses nor duplicates rows. Stops once "
        "caught up unless --follow.",
    )
    _source(archive)
    add_db_argument(archive)
    archive.add_argument("--max-per-batch", type=int, default=10_000, help="records per batch")
    archive.add_argument("--follow", action="store_true", help="keep archiving until Ctrl-C")
    _common(archive)
    archive.set_defaults(func=_archive, parser=archive)

    reseq = jobs.add_parser(
        "resequence",
        help="publish each group's records in sequence order to another stream",
        description="Stateful streaming over the bolide.seq.* headers; runs until Ctrl-C "
        "or --run-for-s.",
    )
    _source(reseq)
    reseq.add_argument("--output", required=True, help="stream receiving ordered records")
    reseq.add_argument("--mode", choices=("batch", "stream"), default="batch")
    reseq.add_argument("--timeout-s", type=float, default=30.0, help="group timeout (30)")
    reseq.add_argument("--on-timeout", choices=("release", "dead_letter"), default="release")
    reseq.add_argument("--dead-letter", default=None, help="dead-letter stream")
    reseq.add_argument("--trigger-s", type=float, default=1.0, help="micro-batch interval (1)")
    reseq.add_argument("--run-for-s", type=float, default=None, help="stop after this long")
    _common(reseq)
    reseq.set_defaults(func=_resequence, parser=reseq)

    query = jobs.add_parser(
        "query",
        help="run Spark SQL over archived records",
        description="Load archived records as the view 'records' (columns key, value, topic, "
        "partition, offset, timestamp, timestampType, headers) and run SQL over it.",
    )
    query.add_argument("sql", help="Spark SQL over the view 'records'")
    add_db_argument(query)
    query.add_argument("--stream", action="append", default=None, help="limit to (repeatable)")
    query.add_argument("--via", choices=("auto", "jdbc", "store"), default="auto")
    query.add_argument("--limit", type=int, default=20, help="rows to print (20)")
    _common(query)
    query.set_defaults(func=_query)


def _require(args: argparse.Namespace, *names: str) -> None:
    for name in names:
        if not getattr(args, name):
            flag = f"--{name}"
            print(
                f"bolide spark: error: {flag} is required (or set its environment default)",
                file=sys.stderr,
            )
            raise SystemExit(2)


def _session(args: argparse.Namespace, job: str) -> Any:
    """The job's SparkSession, with this process as its driver (client mode)."""
    if args.deploy_mode == "cluster":
        print(
            "bolide spark: error: --deploy-mode cluster: this command is the driver, so it runs "
            "in client mode; for cluster mode submit its file with spark-submit "
            "--deploy-mode cluster and pass --master submit (docs/spark.md)",
            file=sys.stderr,
        )
        raise SystemExit(2)
    master = None if args.master == "submit" else args.master
    return spark_session(
        f"bolide-{job}", master, packages=args.packages, config=dict(args.conf) or None
    )


def _progress(report: Any) -> None:
    if not report.rows:  # no-data batches (state timeouts) would flood the output
        return
    line = (
        f"batch {report.batch_id}: {report.rows} rows, {report.written} written"
        + (f", {report.dead_letters} dead letters" if report.dead_letters else "")
        + f" ({report.seconds:.2f}s)"
    )
    print(line, flush=True)


def _stop_on_signal(query: Any, stop_after_s: float | None) -> None:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    began = time.monotonic()
    try:
        while query.isActive and not stop.wait(0.5):
            if stop_after_s is not None and time.monotonic() - began >= stop_after_s:
                break
    except KeyboardInterrupt:
        pass
    query.stop()


def _archive(args: argparse.Namespace) -> int:
    _require(args, "bootstrap", "db")

    spark = _session(args, "archive")
    query = archive(
        spark,
        args.stream,
        args.db,
        args.checkpoint,
        bootstrap=cluster_from_args(args),
        source=args.source,
        starting_offsets=args.starting_offsets,
        max_offsets_per_trigger=args.max_per_batch,
        until_caught_up=not args.follow,
        on_batch=_progress,
    )
    if args.follow:
        _stop_on_signal(query, None)
    print(f"archived {args.stream} into {args.db}", flush=True)
    return 0


def _resequence(args: argparse.Namespace) -> int:
    _require(args, "bootstrap")

    spark = _session(args, "resequence")
    query = resequence(
        spark,
        args.stream,
        args.output,
        args.checkpoint,
        bootstrap=cluster_from_args(args),
        mode=args.mode,
        timeout_s=args.timeout_s,
        on_timeout=args.on_timeout,
        dead_letter=args.dead_letter,
        source=args.source,
        starting_offsets=args.starting_offsets,
        trigger_interval_s=args.trigger_s,
        on_batch=_progress,
    )
    print(f"resequencing {args.stream} -> {args.output}; Ctrl-C stops", flush=True)
    _stop_on_signal(query, args.run_for_s)
    return 0


def _query(args: argparse.Namespace) -> int:
    _require(args, "db")
    from pyspark.errors import AnalysisException

    spark = _session(args, "query")
    try:
        df = query(spark, args.sql, args.db, args.stream, via=args.via)
        df.show(args.limit, truncate=60)
    except AnalysisException as exc:
        print(f"bolide spark: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":  # spark-submit .../bolide/cli/spark.py JOB ...
    from bolide.cli.main import main

    sys.exit(main(["spark", *sys.argv[1:]]))
