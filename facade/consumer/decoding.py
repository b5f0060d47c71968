"""``Decoder``: a subscriber's serde, and the dead letter stream for what it cannot decode."""

from __future__ import annotations

from bolide.facade.config import Cluster, SubscriberConfig
from bolide.facade.deadletter import LetterBox, Reason
from bolide.facade.errors import SerializationError
from bolide.facade.ports import decode_with
from bolide.facade.record import Record

__all__ = ["Decoder"]


class Decoder:
    """Decodes ``record.value`` with ``config.serde``; sends undecodable records to
    ``config.dead_letter`` when it is set (its publisher is made on the first one)."""

    def __init__(self, cluster: Cluster, config: SubscriberConfig) -> None:
        self._serde = config.serde
        self._decode = decode_with(config.serde)
        self._topic = config.single.name
        dead_letter = config.dead_letter
        self._letters = None if dead_letter is None else LetterBox(cluster, dead_letter)

    def decode(self, record: Record) -> SerializationError | None:
        """Decode ``record.value``; return a permanent failure, raise a retriable one.

        A serde's own exception (not a ``SerializationError``) is a permanent failure too,
        wrapped with the record's place and the original as its cause.

        Raises:
            SerializationError: A retriable failure (the registry is unreachable): the record
                is tried again on the next poll.
        """
        serde = self._serde
        if record.data is None:
            return None  # a tombstone has no value to decode: record.value stays None
        try:
            record.value = self._decode(record, self._topic)
        except SerializationError as exc:
            if exc.retriable:
                raise
            return exc
        except Exception as exc:
            error = SerializationError(
                f"{type(serde).__name__} could not decode {self._topic}[{record.partition}] "
                f"offset {record.offset}: {type(exc).__name__}: {exc}",
                stream=self._topic,
                partition=record.partition,
                offset=record.offset,
            )
            error.__cause__ = exc
            return error
        return None

    def dead_letter(self, record: Record, exc: SerializationError) -> None:
        """Publish an undecodable ``record`` to the dead letter stream, with why and whence."""
        assert self._letters is not None
        self._letters.post(record, Reason.UNDECODABLE, str(exc))

    def close(self) -> None:
        """Close the dead letter publisher, if one was made."""
        if self._letters is not None:
            self._letters.close()
