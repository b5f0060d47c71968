"""What a cluster's brokers support, where the stores and tests have always imported it: it
lives in ``bolide.facade.kafka.features``."""

from bolide.facade.kafka.features import (
    SHARE_GROUP_APIS,
    BrokerFeatures,
    bootstrap_wire,
    broker_features,
)

__all__ = ["SHARE_GROUP_APIS", "BrokerFeatures", "bootstrap_wire", "broker_features"]
