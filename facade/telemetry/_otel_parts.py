"""The parts of bolide's OpenTelemetry instrumentation that need no provider: attribute
names, the header getter, counters kept in integers, hook guards, and ``Watched``: the clients
the gauges read (subscribers, archivers, resequencers, durable registries)."""

from __future__ import annotations

import functools
import logging
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Protocol, TypeVar, cast

from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.propagators.textmap import Getter

from bolide.facade.kafka import client_backlog
from bolide.facade.record import Headers

__all__ = [
    "DURATION_BUCKETS",
    "GETTER",
    "HealthSource",
    "Reader",
    "Report",
    "Totals",
    "Watched",
    "group_of",
    "guarded",
]

log = logging.getLogger("bolide.telemetry")

_Hook = TypeVar("_Hook", bound=Callable[..., None])


def guarded(hook: _Hook) -> _Hook:
    """Telemetry never breaks what it observes: a failing hook is logged and returns."""

    @functools.wraps(hook)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        try:
            hook(*args, **kwargs)
        except Exception:
            log.exception("telemetry: %s failed", hook.__name__)

    return cast(_Hook, wrapper)


# Attribute names (OpenTelemetry messaging semantic conventions).
SYSTEM = "messaging.system"
DESTINATION = "messaging.destination.name"
PARTITION = "messaging.destination.partition.id"
GROUP = "messaging.consumer.group.name"
OPERATION = "messaging.operation.name"
OPERATION_TYPE = "messaging.operation.type"
OFFSET = "messaging.kafka.offset"
ERROR_TYPE = "error.type"
DURABLE_ID = "bolide.durable.id"

#: Buckets the conventions ask for on duration histograms (seconds).
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10)

Report = Callable[[Any, Any], None]


class _HeaderGetter(Getter[Headers]):
    """Reads W3C trace context (or any propagator's fields) from a record's header pairs."""

    def get(self, carrier: Headers, key: str) -> list[str] | None:
        values = [v.decode("latin-1") for k, v in carrier if k == key]
        return values or None

    def keys(self, carrier: Headers) -> list[str]:
        return [k for k, _ in carrier]


GETTER = _HeaderGetter()


class Totals:
    """A counter kept in plain integers and reported at each collection (an observable
    counter): the SDK's ``Counter.add`` costs about 12 µs a call, too much per record."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # delivery reports may be served on two threads
        self._totals: dict[tuple[tuple[str, str], ...], int] = {}

    def add(self, amount: int, attributes: Mapping[str, str]) -> None:
        key = tuple(attributes.items())
        with self._lock:
            self._totals[key] = self._totals.get(key, 0) + amount

    def observe(self, options: CallbackOptions) -> Iterator[Observation]:
        with self._lock:
            totals = list(self._totals.items())
        for key, total in totals:
            yield Observation(total, dict(key))


class HealthSource(Protocol):
    """What the lag gauges read: a subscriber or an archiver."""

    def health(self, *, lag: bool = True) -> Any: ...


class Member(Protocol):
    """A reader's membership: the consumer group it reports (``None`` without one)."""

    @property
    def group(self) -> str | None: ...


class Reader(Protocol):
    """What the delivery hooks read of a subscriber."""

    topic: str
    group_id: str

    @property
    def membership(self) -> Member: ...


def group_of(reader: Reader) -> str | None:
    return reader.membership.group


class Watched:
    """What the gauges read while it lives: subscribers and archivers (their ``health()``),
    resequencers, and the durable registries handed to ``watch_durable``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._health: weakref.WeakSet[Any] = weakref.WeakSet()
        self._resequencers: weakref.WeakSet[Any] = weakref.WeakSet()
        self._durable: list[tuple[Any, Callable[[], Iterable[Any]]]] = []

    def watch(self, client: HealthSource) -> None:
        """Report ``client.health()`` lags (a subscriber or an archiver) while it lives."""
        self._health.add(client)

    def watch_resequencer(self, resequencer: Any) -> None:
        """Report how many records ``resequencer`` holds while it lives."""
        self._resequencers.add(resequencer)

    def watch_durable(self, cluster: Any, clients: Callable[[], Iterable[Any]]) -> None:
        """Report the backlog of every durable client ``clients()`` lists (a registry's
        ``list``), per stream and partition."""
        with self._lock:
            self._durable.append((cluster, clients))

    def unwatch_durable(self) -> None:
        """Stop reporting durable backlogs."""
        with self._lock:
            self._durable.clear()

    def observe_lag(self, kind: str) -> Callable[[CallbackOptions], Iterator[Observation]]:
        def observe(options: CallbackOptions) -> Iterator[Observation]:
            for client in list(self._health):
                try:
                    health = client.health()
                except Exception:  # closed or unreachable: nothing to report this time
                    continue
                if health.kind != kind or health.closed:
                    continue
                for p in health.partitions:
                    if p.lag is None:
                        continue
                    attrs = {SYSTEM: "kafka", DESTINATION: p.stream, PARTITION: str(p.partition)}
                    if health.group is not None:
                        attrs[GROUP] = health.group
                    yield Observation(p.lag, attrs)

        return observe

    def observe_held(self, options: CallbackOptions) -> Iterator[Observation]:
        for resequencer in list(self._resequencers):
            yield Observation(
                resequencer.metrics().buffered, {"bolide.resequencer.mode": resequencer.mode}
            )

    def observe_backlog(self, options: CallbackOptions) -> Iterator[Observation]:
        with self._lock:
            sources = list(self._durable)
        for cluster, clients in sources:
            for client in clients():
                for stream, parts in client_backlog(cluster, client).items():
                    for partition, backlog in parts.items():
                        attrs = {
                            SYSTEM: "kafka",
                            DESTINATION: stream,
                            PARTITION: str(partition),
                            GROUP: client.group_id,
                            DURABLE_ID: client.durable_id,
                        }
                        yield Observation(backlog, attrs)
