"""The demo's market: the order schema, the symbols, the venues and how they publish.

Each venue (a publisher) lists its own symbols, so every symbol has one source and one
sequence of orders (``seq`` 0, 1, 2...): a subscriber group must deliver each symbol's orders in
that order. A multi-part (block) order is split into parts, each published as a record of a
resequenced group; some blocks are sent part by part by different venues in a shuffled order,
as fills reported by several venues arrive.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bolide.facade.config import Cluster, PublisherConfig, StreamConfig
from bolide.facade.publisher import Publisher
from bolide.facade.record import Record
from bolide.facade.resequencer.core import publish_sequence
from bolide.facade.resequencer.sequence import sequence_headers
from bolide.facade.schemas.avro import AvroSerde

__all__ = ["ORDER_SCHEMA", "SYMBOLS", "Block", "Market", "is_block_part"]

#: The Avro schema of every record of the demo's stream.
ORDER_SCHEMA: dict[str, Any] = {
    "type": "record",
    "name": "Order",
    "namespace": "bolide.demo",
    "fields": [
        {"name": "order_id", "type": "string"},
        {"name": "symbol", "type": "string"},
        {"name": "side", "type": {"type": "enum", "name": "Side", "symbols": ["BUY", "SELL"]}},
        {"name": "quantity", "type": "int"},
        {"name": "price", "type": "double"},
        {"name": "seq", "type": "long", "doc": "place in the symbol's order flow (0-based)"},
        {"name": "venue", "type": "string"},
        {"name": "block_id", "type": ["null", "string"], "default": None},
    ],
}

SYMBOLS = (
    "ACME", "BOLT", "CRUX", "DYNA", "EPIC", "FLUX",
    "GLOW", "HALO", "IONX", "JADE", "KITE", "LUMA",
)  # fmt: skip
_VENUES = ("XPAR", "XAMS", "XBRU")
_BASE_PRICE = {s: 20.0 + 7.5 * i for i, s in enumerate(SYMBOLS)}


def is_block_part(order: dict[str, Any]) -> bool:
    """True for a part of a multi-part order (it is resequenced, not checked per symbol)."""
    return order.get("block_id") is not None


@dataclass(frozen=True)
class Block:
    """A multi-part order as published: its id, its parts and whether they went out shuffled."""

    block_id: str
    parts: int
    shuffled: bool


class Market:
    """Three venues publishing Avro orders for a dozen symbols to one stream.

    Args:
        cluster: Where the stream lives.
        stream: The stream (multi-partition, ``global_order=False``).
        serde: The Avro serde (its schema registry assigns the schema id).
        seed: Seed of the random sides, quantities and prices.
    """

    def __init__(self, cluster: Cluster, stream: StreamConfig, serde: AvroSerde, seed: int) -> None:
        self.stream = stream
        self.serde = serde
        self._random = random.Random(seed)
        self.publishers = [
            Publisher(
                cluster,
                PublisherConfig(
                    stream=stream, serde=serde, producer_config={"client.id": f"venue-{v}"}
                ),
            )
            for v in _VENUES
        ]
        # Each venue lists four symbols: one source, hence one order sequence, per symbol.
        self._listing = {s: i % len(_VENUES) for i, s in enumerate(SYMBOLS)}
        self._next_seq = dict.fromkeys(SYMBOLS, 0)
        self._blocks = 0
        self.published = 0
        self.blocks: list[Block] = []

    @property
    def venues(self) -> tuple[str, ...]:
        """The venue (publisher) names."""
        return _VENUES

    def orders_per_symbol(self) -> dict[str, int]:
        """How many plain orders each symbol has had so far."""
        return dict(self._next_seq)

    def _order(self, symbol: str, seq: int, block_id: str | None = None) -> dict[str, Any]:
        rnd = self._random
        return {
            "order_id": f"{symbol}-{seq}" if block_id is None else f"{block_id}-{seq}",
            "symbol": symbol,
            "side": rnd.choice(("BUY", "SELL")),
            "quantity": rnd.randrange(1, 50) * 10,
            "price": round(_BASE_PRICE[symbol] * rnd.uniform(0.97, 1.03), 2),
            "seq": seq,
            "venue": _VENUES[self._listing[symbol]],
            "block_id": block_id,
        }

    def publish_orders(
        self,
        count: int,
        *,
        chunk: int = 0,
        pause_s: float = 0.0,
        stop: threading.Event | None = None,
    ) -> int:
        """Publish ``count`` orders spread over the symbols, each by its symbol's venue.

        Args:
            count: Orders to publish.
            chunk: With ``pause_s``, pause after every ``chunk`` orders (a steady flow).
            pause_s: The pause.
            stop: Set to stop early.

        Returns:
            How many orders were published (all acknowledged).
        """
        futures = []
        sent = 0
        for i in range(count):
            if stop is not None and stop.is_set():
                break
            symbol = SYMBOLS[self._random.randrange(len(SYMBOLS))]
            seq = self._next_seq[symbol]
            self._next_seq[symbol] = seq + 1
            data = self.serde.encode(self._order(symbol, seq), stream=self.stream.name)
            pub = self.publishers[self._listing[symbol]]
            futures.append(pub.publish_async(Record(data, group=symbol)))
            sent += 1
            if chunk and pause_s and (i + 1) % chunk == 0:
                time.sleep(pause_s)
        for pub in self.publishers:
            pub.flush(30)
        for future in futures:
            future.result(30)
        self.published += sent
        return sent

    def publish_blocks(self, count: int) -> list[Block]:
        """Publish ``count`` multi-part orders; every other one with its parts shuffled.

        In-order blocks go out through ``publish_sequence``. Shuffled ones are sent part by
        part, each part by the next venue and acknowledged before the next is sent, so they
        reach the stream out of sequence order for the resequencer to put right.
        """
        made: list[Block] = []
        for _ in range(count):
            self._blocks += 1
            symbol = SYMBOLS[self._random.randrange(len(SYMBOLS))]
            block_id = f"BLK-{self._blocks:03d}-{symbol}"
            size = self._random.randrange(3, 6)
            parts = [self._order(symbol, n, block_id) for n in range(size)]
            shuffled = self._blocks % 2 == 0
            if not shuffled:
                publish_sequence(self.publishers[self._listing[symbol]], parts, block_id)
            else:
                order = list(range(size))
                while order == sorted(order):
                    self._random.shuffle(order)
                for i, number in enumerate(order):
                    data = self.serde.encode(parts[number], stream=self.stream.name)
                    record = Record(
                        data, headers=sequence_headers(block_id, size, number), group=block_id
                    )
                    self.publishers[i % len(self.publishers)].publish(record)
            self.published += size
            made.append(Block(block_id, size, shuffled))
        self.blocks.extend(made)
        return made

    def close(self) -> None:
        """Flush and close every venue's publisher."""
        for pub in self.publishers:
            pub.close()


def wait_for(check: Callable[[], bool], timeout_s: float, interval_s: float = 0.05) -> bool:
    """Poll ``check`` until it is true or ``timeout_s`` passes; return the last result."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval_s)
    return True
