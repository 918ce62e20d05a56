"""`tributary query` prints a result as the HTTP API encodes it, without the web framework's
import for plain JSON values."""

import datetime
import enum
import json
import uuid
from dataclasses import dataclass
from decimal import Decimal

import pytest
from fastapi.encoders import jsonable_encoder

from infra.cli_query import json_ready


class Kind(enum.StrEnum):
    POST = "post"


@dataclass
class Row:
    id: int
    at: datetime.datetime


PLAIN: list[object] = [
    [],
    {},
    None,
    [{"id": 1, "text": "héllo", "score": 1.5, "tags": ["a", "b"], "gone": None, "ok": True}],
    {"rows": ({"id": 2},), "total": 1},
    float("nan"),
]
OTHER: list[object] = [
    [{"at": datetime.datetime(2026, 11, 26, 15, 0, tzinfo=datetime.UTC)}],
    {"amount": Decimal("1.50"), "count": Decimal("3")},
    [Kind.POST],
    {"id": uuid.UUID(int=7)},
    [Row(1, datetime.datetime(2026, 1, 1))],
    {1: "an int key"},
    {"tags": {"x"}},
]


@pytest.mark.parametrize("value", PLAIN + OTHER)
def test_encoded_as_the_http_api_encodes_it(value: object) -> None:
    assert json.dumps(json_ready(value)) == json.dumps(jsonable_encoder(value))


@pytest.mark.parametrize("value", PLAIN)
def test_plain_values_are_passed_through(value: object) -> None:
    assert json_ready(value) is value
