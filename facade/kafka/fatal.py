"""Broker answers that retrying cannot fix, as typed errors.

librdkafka retries most errors by itself and reports each attempt; for these answers every
retry gets the same refusal (a missing ACL, wrong credentials, a lease the broker forbids),
so a client that only logs them loops forever. ``fatal_error`` names the resource and the fix;
``None`` means "retriable: keep going as before".
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal

from confluent_kafka import KafkaError

from bolide.facade.errors import (
    AuthenticationError,
    AuthorizationError,
    BolideError,
    FencedInstanceError,
    IncompatibleBrokerError,
)
from bolide.facade.record import Record

__all__ = [
    "AUTHENTICATION_CODES",
    "FATAL_CODES",
    "Refusals",
    "Role",
    "Scope",
    "authentication_error",
    "fatal_error",
    "refused",
]

log = logging.getLogger("bolide.facade")

Role = Literal["publisher", "subscriber"]

_AUTHORIZATION = {
    KafkaError.TOPIC_AUTHORIZATION_FAILED: "topic",
    KafkaError.GROUP_AUTHORIZATION_FAILED: "group",
    KafkaError.CLUSTER_AUTHORIZATION_FAILED: "cluster",
    KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED: "transactional_id",
}
#: The error codes of refused credentials.
AUTHENTICATION_CODES = frozenset(
    {KafkaError.SASL_AUTHENTICATION_FAILED, KafkaError._AUTHENTICATION}
)
_INCOMPATIBLE = frozenset({KafkaError.INVALID_SESSION_TIMEOUT, KafkaError.UNSUPPORTED_VERSION})

#: Every error code ``fatal_error`` turns into an error.
FATAL_CODES = frozenset({*_AUTHORIZATION, *AUTHENTICATION_CODES, *_INCOMPATIBLE})


def refused(err: KafkaError) -> bool:
    """Whether a consumer's ``err`` is an answer retrying cannot fix: a ``FATAL_CODES`` one,
    or librdkafka's fatal error, after which the consumer serves nothing (for a consumer,
    another live member with its ``group.instance.id``)."""
    return err.code() in FATAL_CODES or err.code() == KafkaError._FATAL


def _fenced(err: KafkaError) -> bool:
    return err.code() == KafkaError._FATAL and "group.instance.id" in err.str()


def _unreleased(err: KafkaError) -> bool:
    """The consumer protocol's refusal of a member joining with an instance id another live
    member holds (UNRELEASED_INSTANCE_ID, fatal to the newcomer in librdkafka)."""
    if err.code() == KafkaError.UNRELEASED_INSTANCE_ID:
        return True
    return err.code() == KafkaError._FATAL and "instance ID is still used" in err.str()


@dataclass(frozen=True)
class Scope:
    """What a client works on, to name in the error.

    Attributes:
        role: A publisher writes ``topic``; a subscriber reads it, in ``group`` if any.
        topic: The stream.
        group: The consumer group.
        transactional_id: A transactional publisher's id.
        instance_id: A static member's ``group.instance.id``.
        lease_ms: A grouped subscriber's ``lease_timeout_ms``.
        session_floor_ms: The broker's ``group.min.session.timeout.ms``, when known.
    """

    role: Role
    topic: str
    group: str | None = None
    transactional_id: str | None = None
    instance_id: str | None = None
    lease_ms: int | None = None
    session_floor_ms: int | None = None


def fatal_error(err: KafkaError, scope: Scope, record: Record | None = None) -> BolideError | None:
    """The typed error for a broker answer that retrying cannot fix, else ``None``."""
    code = err.code()
    said = err.str()
    if code in _AUTHORIZATION:
        kind = _AUTHORIZATION[code]
        name, fix = _acl_fix(kind, scope)
        return AuthorizationError(
            f"the broker refused the {scope.role} of {scope.topic!r} ({said}): {fix}",
            resource_type=kind,
            resource=name,
            cause=err,
            record=record,
            stream=scope.topic,
        )
    if code in AUTHENTICATION_CODES:
        return authentication_error(err, scope.topic, record)
    if _fenced(err) or _unreleased(err):
        # Classic: the last to join takes the partitions; consumer protocol: it is refused.
        ours = f"this {scope.role}'s group.instance.id {scope.instance_id!r}"
        what = (
            f"another live member of group {scope.group!r} holds {ours}, and the broker "
            "refused this one"
            if _unreleased(err)
            else f"another member of group {scope.group!r} joined with {ours} and took its "
            "partitions"
        )
        return FencedInstanceError(
            f"{what} ({said}): give every live member a group.instance.id of its own",
            group=scope.group,
            instance_id=scope.instance_id,
            cause=err,
            stream=scope.topic,
        )
    if code == KafkaError.INVALID_SESSION_TIMEOUT:
        floor = (
            f"{scope.session_floor_ms} ms"
            if scope.session_floor_ms is not None
            else "unknown here (6000 ms by default)"
        )
        return IncompatibleBrokerError(
            f"the broker refuses lease_timeout_ms={scope.lease_ms} for group {scope.group!r} "
            f"({said}): its group.min.session.timeout.ms is {floor} (and "
            "group.max.session.timeout.ms the most): set lease_timeout_ms between them",
            stream=scope.topic,
        )
    if code == KafkaError.UNSUPPORTED_VERSION:
        return IncompatibleBrokerError(
            f"the broker does not support a request of this {scope.role} ({said}): a newer "
            "broker, or a setting that needs none (such as group.protocol), is the fix",
            stream=scope.topic,
        )
    return None


def authentication_error(
    err: KafkaError, topic: str, record: Record | None = None
) -> AuthenticationError:
    """The error for refused credentials (``err``), met working on ``topic``."""
    return AuthenticationError(
        f"the broker refused this client's credentials ({err.str()}): check sasl.username, "
        "sasl.password and sasl.mechanism (or the client certificate) in the Cluster",
        cause=err,
        record=record,
        stream=topic,
    )


def _acl_fix(kind: str, scope: Scope) -> tuple[str | None, str]:
    """The resource refused and the ACL that allows what ``scope`` does with it."""
    if kind == "topic":
        operation = "WRITE" if scope.role == "publisher" else "READ"
        return scope.topic, f"grant the user {operation} on topic {scope.topic!r}"
    if kind == "group" and scope.group is None:
        # An ungrouped subscriber's consumer still has a throwaway group (it never commits).
        return None, "grant the user READ on groups prefixed 'bolide-ungrouped-' (PREFIXED)"
    if kind == "group":
        return scope.group, f"grant the user READ on group {scope.group!r}"
    if kind == "transactional_id":
        tid = scope.transactional_id
        return tid, f"grant the user WRITE and DESCRIBE on transactional id {tid!r}"
    if scope.role == "publisher":
        # Since Kafka 3.0 WRITE on a topic includes the idempotent producer id.
        return None, (
            f"an idempotent publisher needs WRITE on topic {scope.topic!r} (or "
            "IDEMPOTENT_WRITE on the cluster): grant the user that"
        )
    return None, "grant the user the cluster operation the broker names in its log"


class Refusals:
    """A consumer's ``error_cb``: keeps the last answer retrying cannot fix, for the thread
    that polls to raise (what a callback raises only reaches librdkafka). Other errors are
    librdkafka's own retries, which its log already shows: logged at debug level only."""

    def __init__(self, source: str) -> None:
        self._source = source
        self._last: KafkaError | None = None

    def error_cb(self, err: KafkaError) -> None:
        """librdkafka's client-wide error report (served inside ``poll``/``consume``)."""
        if refused(err):
            self._last = err
        else:
            log.debug("%s: %s", self._source, err.str())

    def take(self) -> KafkaError | None:
        """The answer kept since the last call, if any (then forgotten: raised once)."""
        err, self._last = self._last, None
        return err
