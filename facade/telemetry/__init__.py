"""OpenTelemetry metrics and W3C trace context for bolide (``pip install 'bolide[otel]'``).

Whether ``opentelemetry-api`` is installed is decided once, at import: without it
``TELEMETRY`` is ``None`` and every hook in the publisher, subscriber, receiver, resequencer
and archiver costs one ``is not None`` test. With it, bolide reports to the global tracer and
meter providers (no-ops until the application installs the SDK and sets them), or to the
providers given to ``configure``.

Traces: a publish starts a ``send <stream>`` span (PRODUCER) and puts its context in the
record's headers (``traceparent``, ``tracestate``: the global propagator's fields, W3C trace
context by default), also in ``Record.headers`` so a published record equals the one read
back. A poll gives each record that carries a context a ``poll <stream>`` span (CONSUMER), a
receiver's handler runs in a ``process <stream>`` span (current while it runs, so records it
publishes continue the trace), and the archiver gives each such record an ``archive <stream>``
span: each a child of the producer's span, with a link to it.

Metrics (attributes ``messaging.system="kafka"``, ``messaging.destination.name``,
``messaging.destination.partition.id``, ``messaging.consumer.group.name``,
``messaging.operation.name``, ``error.type`` on failures):

- ``messaging.client.sent.messages`` (counter): records published, acknowledged or not.
- ``messaging.client.operation.duration`` (histogram, s): a publish until its acknowledgement.
- ``messaging.client.consumed.messages`` (counter): records a poll delivered.
- ``messaging.process.duration`` (histogram, s): a receiver's handler call.
- ``bolide.consumer.confirmed.messages`` (counter): records a group member confirmed.
- ``bolide.consumer.lag`` (gauge): a subscriber's position to the partition's end.
- ``bolide.archive.rows`` (counter): records the archiver wrote.
- ``bolide.archive.lag`` (gauge): the archiver's position to the partition's end.
- ``bolide.resequencer.held`` (gauge): records a resequencer holds back.
- ``bolide.durable.backlog`` (gauge): records waiting for a durable client.

The lag gauges ask each live subscriber and archiver for its ``health()`` at every
collection (one log-end read per stream); the backlog gauge reports the clients of the
registries passed to ``watch_durable``.
"""

from bolide.facade.telemetry.hooks import TELEMETRY, configure, enabled, watch_durable

__all__ = ["TELEMETRY", "configure", "enabled", "watch_durable"]
