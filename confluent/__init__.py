"""A drop-in for confluent-kafka's consumers that reads past Kafka's retention from bolide's
history store: change one import, add ``"bolide.history": <store URL>`` to the configuration.

``from bolide.confluent import Consumer`` is ``confluent_kafka.Consumer`` with one difference:
where a partition's position lies below the first offset Kafka still holds (a committed offset,
``auto.offset.reset=earliest``, an ``assign``/``seek`` to an archived offset), ``poll`` and
``consume`` hand out the archived records first, as ``confluent_kafka.Message`` objects with
their original topic, partition, offset, key, value, headers and timestamp, then go on from
Kafka with no gap and no repeat. Commits, groups and rebalances stay Kafka's. Without
``bolide.history`` it is confluent-kafka's consumer, unchanged (docs/confluent.md).
"""

from bolide.confluent.consumer import Consumer, DeserializingConsumer

__all__ = ["Consumer", "DeserializingConsumer"]
