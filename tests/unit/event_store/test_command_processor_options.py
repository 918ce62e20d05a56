"""A command processor's options that cannot work together are refused when it is built."""

from typing import Any, cast

import pytest

from connectors.kafka import KafkaConfig
from event_store.command_topic import CommandProcessor
from event_store.errors import EventStoreError


def test_exactly_once_without_an_ownership_is_refused_naming_why() -> None:
    # refused before the bus or Kafka is touched: neither is needed to say so
    with pytest.raises(EventStoreError, match="exactly_once needs an ownership"):
        CommandProcessor(cast(Any, None), KafkaConfig("127.0.0.1:1"), exactly_once=True)
