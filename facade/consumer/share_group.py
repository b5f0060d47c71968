"""A share group as the broker keeps it: whether the cluster has share groups at all, and the
group's own settings (set when a member starts, read back for what the members need)."""

from __future__ import annotations

from dataclasses import dataclass

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

from bolide.facade.config import Cluster, InitialOffsetScheme, SubscriberConfig
from bolide.facade.errors import AuthorizationError, BolideError, BrokerError
from bolide.facade.kafka import admin_client
from bolide.facade.kafka.fatal import AUTHENTICATION_CODES, authentication_error
from bolide.facade.kafka.features import broker_features

__all__ = ["GroupSettings", "configure_group", "require_share_groups"]


@dataclass(frozen=True)
class GroupSettings:
    """What the members of a share group need to know of its settings."""

    #: ``share.delivery.count.limit``: deliveries before the group archives a record.
    delivery_limit: int
    #: ``share.record.lock.duration.ms``: how long an acquired record stays with its member.
    lock_duration_ms: int


def require_share_groups(cluster: Cluster) -> None:
    """Refuse a cluster without share groups (Tansu; Kafka before 4.1; ``share.version`` not
    enabled), naming what is missing. A cluster behind TLS or SASL is not probed.

    Raises:
        BrokerError: Share groups are not available there.
    """
    features = broker_features(cluster)
    missing = features.share_groups() if features is not None else None
    if missing is not None:
        raise BrokerError(f"share groups need Apache Kafka 4.1 or later: {missing}")


def configure_group(cluster: Cluster, config: SubscriberConfig) -> GroupSettings:
    """Set the share group's own settings on the broker (``share.auto.offset.reset`` from the
    initial offset scheme, ``share.isolation.level`` from ``isolation``, then
    ``share_group_config``) and read back what the members need.

    Raises:
        AuthorizationError: The user may not alter the group's settings.
        AuthenticationError: The broker refused the client's credentials.
        ValueError: The broker refused a setting.
    """
    group = str(config.share_group)
    earliest = config.initial_offset_scheme is not InitialOffsetScheme.LATEST
    settings = {
        "share.auto.offset.reset": "earliest" if earliest else "latest",
        "share.isolation.level": config.isolation,
    }
    settings.update({k: str(v) for k, v in config.share_group_config.items()})
    entries = [
        ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in settings.items()
    ]
    admin = admin_client(cluster)  # kept alive until the answers come
    try:
        resource = ConfigResource(ConfigResource.Type.GROUP, group, incremental_configs=entries)
        for future in admin.incremental_alter_configs([resource]).values():
            future.result(timeout=30)
        described = ConfigResource(ConfigResource.Type.GROUP, group)
        [answer] = admin.describe_configs([described]).values()
        values = {name: entry.value for name, entry in answer.result(timeout=30).items()}
    except KafkaException as exc:
        raise _refusal(group, config.single.name, exc.args[0]) from exc
    return GroupSettings(
        delivery_limit=int(values.get("share.delivery.count.limit") or 5),
        lock_duration_ms=int(values.get("share.record.lock.duration.ms") or 30_000),
    )


def _refusal(group: str, topic: str, err: KafkaError) -> BolideError | ValueError:
    """What a refused setting of share group ``group`` raises: a missing ACL or refused
    credentials as their typed errors, a setting the broker refused as a ``ValueError``."""
    if err.code() == KafkaError.GROUP_AUTHORIZATION_FAILED:
        return AuthorizationError(
            f"the broker refused to set the settings of share group {group!r} ({err.str()}): "
            f"a member sets them when it starts; grant the user ALTER_CONFIGS on group "
            f"{group!r} (it includes DESCRIBE_CONFIGS), besides READ on it",
            resource_type="group",
            resource=group,
            cause=err,
            stream=topic,
        )
    if err.code() in AUTHENTICATION_CODES:
        return authentication_error(err, topic)
    return ValueError(f"share_group_config of {group!r}: {err.str()}")
