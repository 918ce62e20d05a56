"""The Redis store's key names and field rendering (pure functions, no Redis)."""

import pytest

from connectors.errors import StoreError
from connectors.stores.redis import KeyNames, glob_escape, matches, overlap, render


def names(**formats: str) -> KeyNames:
    return KeyNames.build("v", ["items", "groups", "profiles"], formats or None)


def test_logical_names_carry_view_collection_and_key() -> None:
    keys = names()
    assert keys.entry("items", "42") == "tributary:v:items:42"
    assert keys.key_of("items", "tributary:v:items:42") == "42"
    assert keys.key_of("items", "tributary:v:groups:42") is None
    assert keys.tombs("items") == "tributary:v:tombs:items"
    assert keys.index("items", "group", "x") == "tributary:v:idx:items:group:x"
    assert keys.ledger("g1") == "tributary:v:ledger:g1"
    assert keys.members("g1") == "tributary:v:members:g1"
    assert keys.live == "tributary:v:live"


def test_a_public_format_names_entries_for_services() -> None:
    keys = names(profiles="profile:{key}")
    assert keys.entry("profiles", "42") == "profile:42"
    assert keys.key_of("profiles", "profile:42") == "42"
    assert keys.key_of("profiles", "tributary:v:profiles:42") is None
    suffixed = KeyNames.build("v", ["a"], {"a": "user:{key}:card"})
    assert suffixed.entry("a", "7") == "user:7:card"
    assert suffixed.key_of("a", "user:7:card") == "7"
    assert suffixed.key_of("a", "user:card") is None


def test_a_shadow_generation_prefixes_every_logical_name() -> None:
    keys = names(profiles="profile:{key}")
    assert keys.physical("profile:42", None) == "profile:42"
    assert keys.physical("profile:42", "g1") == "tributary:v@g1:profile:42"
    assert keys.physical(keys.tombs("items"), "g1") == "tributary:v@g1:tributary:v:tombs:items"


def test_names_that_could_be_read_two_ways_are_refused() -> None:
    with pytest.raises(StoreError, match="tombstones"):
        KeyNames.build("v", ["tombs"])
    with pytest.raises(StoreError, match="could be the same key"):
        KeyNames.build("v", ["a", "b"], {"a": "x:{key}", "b": "x:y:{key}"})
    with pytest.raises(StoreError, match="could be the same key"):
        KeyNames.build("v", ["items", "items:x"])
    with pytest.raises(StoreError, match="once"):
        KeyNames.build("v", ["a"], {"a": "profile"})
    with pytest.raises(StoreError, match="unknown collections"):
        KeyNames.build("v", ["a"], {"b": "b:{key}"})
    with pytest.raises(StoreError, match="':' or '@'"):
        KeyNames.build("a:b", ["a"])
    # Names that only look alike are fine.
    KeyNames.build("v", ["liver", "a", "b"], {"a": "x:{key}:a", "b": "x:{key}:b"})


def test_pattern_helpers() -> None:
    assert matches(("p:", ""), "p:")
    assert not matches(("p:", ":s"), "p:s")
    assert overlap(("a:", ""), ("a:b:", ""))
    assert not overlap(("a:", ":x"), ("a:", ":y"))
    assert glob_escape("v*[x]?") == "v\\*\\[x\\]\\?"


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        ("text", "text"),
        (42, "42"),
        (1.5, "1.5"),
        (True, "true"),
        (False, "false"),
        (None, None),
        ([1, "a"], '[1,"a"]'),
        ({"k": "é"}, '{"k":"é"}'),
    ],
)
def test_fields_render_for_humans(value: object, shown: str | None) -> None:
    assert render(value) == shown
