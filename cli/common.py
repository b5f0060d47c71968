"""Helpers every ``bolide`` command group shares: cluster and database arguments (rows and
bytes are printed by ``bolide.facade.ops.text``)."""

from __future__ import annotations

import argparse
import datetime
import difflib
import os
from collections.abc import Sequence
from typing import Any

from bolide.facade.config import Cluster

__all__ = [
    "add_bootstrap_argument",
    "add_cluster_arguments",
    "add_db_argument",
    "cluster_from_args",
    "existing_partitions",
    "missing_stream",
    "parse_time_ms",
    "require_streams",
]


def add_bootstrap_argument(parser: argparse.ArgumentParser) -> None:
    """``--bootstrap`` with the ``BOLIDE_BOOTSTRAP`` environment default."""
    parser.add_argument(
        "-b",
        "--bootstrap",
        default=os.environ.get("BOLIDE_BOOTSTRAP"),
        help="Kafka bootstrap servers (default: $BOLIDE_BOOTSTRAP)",
    )


def add_cluster_arguments(parser: argparse.ArgumentParser) -> None:
    """``--bootstrap`` and kcat's ``-X KEY=VALUE`` (librdkafka settings, repeatable).

    Commands that take these build their ``Cluster`` with ``cluster_from_args``.
    """
    add_bootstrap_argument(parser)
    parser.add_argument(
        "-X",
        dest="settings",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="librdkafka setting for every client (repeatable), or fetch_gap_settle_ms",
    )


def cluster_from_args(args: argparse.Namespace) -> Cluster:
    """The ``Cluster`` named by ``--bootstrap`` and ``-X``; a usage error (exit 2) if invalid."""
    parser: argparse.ArgumentParser = args.parser
    if not args.bootstrap:
        parser.error("--bootstrap HOST:PORT is required (or set $BOLIDE_BOOTSTRAP)")
    settings: dict[str, Any] = {}
    for item in args.settings:
        key, sep, value = item.partition("=")
        if not sep or not key:
            parser.error(f"-X expects KEY=VALUE, got {item!r}")
        settings[key] = value
    if "fetch_gap_settle_ms" in settings:
        try:
            settings["fetch_gap_settle_ms"] = int(settings["fetch_gap_settle_ms"])
        except ValueError:
            parser.error("-X fetch_gap_settle_ms expects an integer")
    try:
        cluster = Cluster(args.bootstrap, **settings)
    except (ValueError, TypeError) as error:
        parser.error(str(error))
        raise  # pragma: no cover - error() exits
    if args.settings:
        _admin(args, cluster)  # librdkafka checks every -X now: a refused one exits 2
    return cluster


def _admin(args: argparse.Namespace, cluster: Cluster) -> Any:
    from bolide.facade.kafka import admin_client

    try:
        return admin_client(cluster)
    except ValueError as exc:  # a -X setting librdkafka refuses: named in the message
        args.parser.error(f"-X: {exc}")


def require_streams(args: argparse.Namespace, cluster: Cluster, names: Sequence[str]) -> None:
    """A usage error (exit 2) unless every stream in ``names`` exists: reading commands never
    create a topic."""
    for name in names:
        if existing_partitions(args, cluster, name) is None:
            args.parser.error(missing_stream(args, cluster, name))


def existing_partitions(args: argparse.Namespace, cluster: Cluster, name: str) -> int | None:
    """The partition count of topic ``name``, or ``None`` when it does not exist.

    Raises:
        BolideError: The cluster did not answer.
    """
    from bolide.facade.errors import BolideError
    from bolide.facade.kafka import partition_count

    try:
        return partition_count(_admin(args, cluster), name)
    except Exception as exc:  # KafkaException: the broker did not answer
        raise BolideError(
            f"cannot reach the cluster at {cluster.bootstrap_servers}: {exc}. No broker "
            "there? `bolide broker` runs one for development and prints the "
            "`export BOLIDE_BOOTSTRAP=...` line to use it"
        ) from None


def missing_stream(args: argparse.Namespace, cluster: Cluster, name: str) -> str:
    """The usage error for a stream that does not exist, with similar names as a hint."""
    try:
        topics = list(_admin(args, cluster).list_topics(timeout=10).topics)
    except Exception:  # KafkaException: the hint is a courtesy
        topics = []
    close = difflib.get_close_matches(name, topics, n=3, cutoff=0.6)
    hint = f" (did you mean {', '.join(repr(t) for t in close)}?)" if close else ""
    return f"stream {name!r} does not exist on {cluster.bootstrap_servers}{hint}"


def add_db_argument(
    parser: argparse.ArgumentParser,
    *,
    required: bool = True,
    aliases: Sequence[str] = (),
    help: str = "SQLAlchemy database URL (default: $BOLIDE_DB)",
) -> None:
    """``--db`` (and ``aliases``) with the ``BOLIDE_DB`` environment default."""
    parser.add_argument("--db", *aliases, dest="db", default=os.environ.get("BOLIDE_DB"), help=help)


def parse_time_ms(text: str) -> int:
    """Epoch milliseconds from ``text``: digits (already milliseconds) or ISO 8601.

    An ISO 8601 time without a UTC offset is taken as UTC.

    Raises:
        ValueError: ``text`` is neither.
    """
    text = text.strip()
    if text.isdigit():
        return int(text)
    try:
        when = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(
            f"--from-time {text!r} is neither epoch milliseconds nor ISO 8601"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    return int(when.timestamp() * 1000)
