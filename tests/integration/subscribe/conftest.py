"""Subscriber tests: records in the on-topic formats produced straight to the session's broker."""

import time
from collections.abc import Callable
from typing import Any, TypeVar

from connectors.kafka.config import ClientValue
from connectors.subscriber import Delivery, Subscriber, subscribe
from tests.integration.conftest import Endpoints

E = TypeVar("E")

#: Tansu answers a JoinGroup after about half the session timeout: keep it short in tests.
GROUP_PROPERTIES: dict[str, ClientValue] = {
    "session.timeout.ms": 6000,
    "heartbeat.interval.ms": 500,
}


def subscribed(
    stack: Endpoints, topics: list[str], group: str | None, **options: Any
) -> Subscriber[Any]:
    """``subscribe`` on the session's broker and schema registry: in a group with
    :data:`GROUP_PROPERTIES`, or (``group`` None) in assign mode."""
    if group is None:
        options.setdefault("assign", True)
    else:
        options.setdefault("properties", GROUP_PROPERTIES)
    return subscribe(
        topics,
        group,
        kafka=stack.kafka,
        schema_registry_url=stack.settings.registry_url,
        **options,
    )


def read_until(
    subscriber: Subscriber[E],
    done: Callable[[list[Delivery[E]]], bool],
    timeout: float = 60.0,
) -> list[Delivery[E]]:
    """Poll until ``done(deliveries)`` (or fail after ``timeout`` seconds)."""
    out: list[Delivery[E]] = []
    deadline = time.monotonic() + timeout
    while not done(out):
        assert time.monotonic() < deadline, f"only {len(out)} records after {timeout:.0f}s"
        delivery = subscriber.poll(0.5)
        if delivery is not None:
            out.append(delivery)
    return out
