"""The subscriber kinds, each built by ``Subscriber(...)`` as its config names it
(``bolide.facade.subscriber``): ``one_stream.OneStreamSubscriber`` (one stream through one Kafka
consumer, what ``Subscriber`` is), ``streams.StreamsSubscriber`` (several streams or a pattern)
and ``share.ShareSubscriber`` (a Kafka share group). Import them from ``bolide.facade``; this
package may change without notice."""
