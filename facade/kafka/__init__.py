"""Kafka as the rest of bolide talks to it: client settings and construction, topics, offsets
and log ends (``admin``), which topic a name stands for (``identity``), the workarounds for
brokers that deviate from Apache Kafka (``compat``), what a cluster's brokers support
(``features``), DeleteRecords (``deletion``) and the few requests spoken directly
(``wire``). The helpers of ``admin`` and ``identity`` are importable from this package
itself, as ``bolide.facade.kafka`` has always offered them; ``bolide.facade.compat`` and
``bolide.facade.features`` stay importable too."""

from bolide.facade.kafka import admin, identity
from bolide.facade.kafka.admin import *  # noqa: F403  (the names of its __all__)
from bolide.facade.kafka.identity import *  # noqa: F403  (the names of its __all__)

__all__ = [*admin.__all__, *identity.__all__]
