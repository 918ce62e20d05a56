"""Statements for libpq: placeholders become $n, values their PostgreSQL text form."""

import uuid

import psycopg
import pytest

from event_store.prepared import Statement, encode


def test_named_placeholders_become_numbered_ones_each_name_once() -> None:
    statement = Statement.of(
        "SELECT %(a)s::int, %(b)s, %(a)s::bigint WHERE x LIKE 'p%%' AND y = %(c)s"
    )
    assert statement.text == b"SELECT $1::int, $2, $1::bigint WHERE x LIKE 'p%' AND y = $3"
    assert statement.params == ("a", "b", "c")
    assert statement.name.startswith(b"tributary_")
    assert Statement.of("SELECT %(a)s::int").name != Statement.of("SELECT %(a)s::bigint").name


def test_values_are_sent_in_their_text_form() -> None:
    assert encode(None) is None
    assert encode("héllo") == "héllo".encode()
    assert encode(-12) == b"-12"
    assert encode(True) == b"t" and encode(False) == b"f"
    ident = uuid.UUID("12345678-1234-5678-1234-567812345678")
    assert encode(ident) == b"12345678123456781234567812345678"
    with pytest.raises(TypeError, match="float"):
        encode(1.5)


def test_arrays_quote_every_element_and_escape_quotes_and_backslashes() -> None:
    values = ['{"text": "say \\"hi\\""}', "back\\slash", None, 3]
    assert (
        encode(values) == b'{"{\\"text\\": \\"say \\\\\\"hi\\\\\\"\\"}","back\\\\slash",NULL,"3"}'
    )
    assert encode([]) == b"{}"


@pytest.mark.parametrize(
    ("value", "words"),
    [("c\x00", "NUL"), (["a", "b\x00"], "NUL"), ("\udc00", "surrogate")],
)
def test_text_postgresql_cannot_hold_is_refused_not_truncated(value: object, words: str) -> None:
    # libpq reads a text parameter up to its first NUL: "c\x00" would arrive as "c"
    with pytest.raises(psycopg.errors.CharacterNotInRepertoire, match=words) as raised:
        encode(value)
    assert raised.value.sqlstate == "22021"
