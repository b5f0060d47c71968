"""``ConsoleSettings``: what a console serves and how it guards the door.

A console is a door into production data, so its defaults are the safe ones: it listens on
loopback; any other address needs a token; it only reads unless ``allow_writes``.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from bolide.facade.config import Cluster

__all__ = ["TOKEN_ENV", "ConsoleSettings", "is_loopback"]

#: The environment variable ``bolide console`` reads its token from.
TOKEN_ENV = "BOLIDE_CONSOLE_TOKEN"


def is_loopback(host: str) -> bool:
    """Whether ``host`` is this machine only (``localhost``, 127.0.0.0/8, ``::1``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class ConsoleSettings:
    """A console's settings.

    Attributes:
        cluster: The Kafka cluster (its security settings are the console's credentials).
        db: The history store's SQLAlchemy URL; ``None``: the pages of the archive, the
            dead letters, SQL and durable clients say that no store is set.
        host: The address to listen on.
        port: The port (0: a free one).
        allow_writes: Dead letters may be replayed and purged (else every write is refused).
        token: The token every request must carry (``Authorization: Bearer``, or the login
            form's cookie); required unless ``host`` is loopback.
        query_timeout_ms: How long one SQL query or archive search may run.
        max_rows: Rows of a query, records of a search, at most.
        scan_limit: Kafka records a search reads past the archive, at most per request.
        sample_s: How often group lags are sampled for the lag charts.

    Raises:
        ValueError: A host other than loopback without a token; a bad number.
    """

    cluster: Cluster
    db: str | None = None
    host: str = "127.0.0.1"
    port: int = 8080
    allow_writes: bool = False
    token: str | None = None
    query_timeout_ms: int = 5_000
    max_rows: int = 1_000
    scan_limit: int = 100_000
    sample_s: float = 5.0

    def __post_init__(self) -> None:
        if not isinstance(self.cluster, Cluster):
            raise TypeError(f"cluster must be a Cluster, not {type(self.cluster).__name__}")
        if not is_loopback(self.host) and not self.token:
            raise ValueError(
                f"the console listens on {self.host}, not loopback: set a token "
                f"(${TOKEN_ENV}) so that only those who hold it get in"
            )
        if self.token is not None and len(self.token) < 16:
            raise ValueError("the console's token must be at least 16 characters")
        for name in ("port", "query_timeout_ms", "max_rows", "scan_limit"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be a non-negative int, not {value!r}")
        if not 0 < self.sample_s <= 3600:
            raise ValueError(f"sample_s must be within (0, 3600], not {self.sample_s!r}")
