"""Operations: consumer lag, archive lag, durable backlogs, topics and groups.

The programmatic side of ``bolide lag``, ``bolide groups``, ``bolide topics`` and
``bolide top``: each command is a thin shim over these functions. Health of a client in the
same process is ``Subscriber.health()`` / ``Archiver.health()`` (``bolide.facade.health``).
"""

from bolide.facade.ops.inventory import (
    GroupInfo,
    MemberInfo,
    PartitionInfo,
    TopicInfo,
    describe_groups,
    list_groups,
    list_topics,
)
from bolide.facade.ops.lag import (
    ArchiveLag,
    DurableBacklog,
    LagReport,
    PartitionLag,
    Rates,
    durable_backlogs,
    lag_report,
    rates,
)

__all__ = [
    "ArchiveLag",
    "DurableBacklog",
    "GroupInfo",
    "LagReport",
    "MemberInfo",
    "PartitionInfo",
    "PartitionLag",
    "Rates",
    "TopicInfo",
    "describe_groups",
    "durable_backlogs",
    "lag_report",
    "list_groups",
    "list_topics",
    "rates",
]
