"""Personal fields (crypto-shredding): AES-GCM per subject, the schema property, the codec,
the SDK's and the social folds' reading — decrypted with the key, redacted without it."""

import json
import uuid
from datetime import UTC, datetime

import pyarrow as pa  # type: ignore[import-untyped]
import pytest
from cryptography.exceptions import InvalidTag

from cdc.outbox import EventOutbox
from connectors.avro import SchemaCache
from connectors.schema_registry.memory import MemoryRegistry
from event_store import EventCodec, EventRegistry
from event_store.errors import EventStoreError
from event_store.forgetting import AppColumn, check_subject, parse_app_tables
from event_store.personal import (
    PERSONAL_PROPERTY,
    REDACTED_TEXT,
    KeyReader,
    MemoryKeys,
    SubjectForgottenError,
    decrypt,
    decrypt_data,
    encrypt,
    key_for_sql,
    new_key,
    personal_fields,
)
from event_store.schemas import avro_schema
from examples.social.posts import POST_EVENTS, PostCreated, PostEdited, PostLiked
from examples.social.views.entities import FORGOTTEN, POSTS
from examples.social.views.folds import _fold_events, decode_event, open_event

U = ("user", "42")
WHEN = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def test_a_token_decrypts_with_its_key_only_and_for_its_subject_and_field_only() -> None:
    key = new_key()
    token = encrypt(key, "hello U", U, "text")
    assert token.startswith("tx1:") and "hello" not in token
    assert decrypt(key, token, U, "text") == "hello U"
    assert decrypt(key, token.encode(), U, "text") == "hello U"  # as Avro bytes
    for wrong in [
        lambda: decrypt(new_key(), token, U, "text"),  # another key
        lambda: decrypt(key, token, ("user", "43"), "text"),  # copied to another subject
        lambda: decrypt(key, token, U, "bio"),  # to another field
    ]:
        with pytest.raises(InvalidTag):
            wrong()


def test_a_missing_or_wrong_key_reads_redacted_never_an_error() -> None:
    marks = personal_fields(PostCreated)
    assert list(marks) == ["text"]
    key = new_key()
    data = {"post_id": 1, "author_id": 42, "text": encrypt(key, "mine", U, "text")}
    assert decrypt_data(marks, data, {U: key})["text"] == "mine"
    assert decrypt_data(marks, data, {U: None})["text"] == REDACTED_TEXT  # forgotten
    assert decrypt_data(marks, data, {})["text"] == REDACTED_TEXT  # no key known
    assert decrypt_data(marks, data, {U: new_key()})["text"] == REDACTED_TEXT  # wrong key
    assert decrypt_data(marks, {**data, "text": "tx1:garbage"}, {U: key})["text"] == REDACTED_TEXT
    assert decrypt_data(marks, data, {}, {"text": "long"})["text"] is None  # not a string


def test_the_avro_schema_carries_the_personal_property_and_an_opaque_type() -> None:
    fields = {f["name"]: f for f in avro_schema(PostEdited)["fields"]}
    assert fields["text"]["type"] == "bytes"
    assert fields["text"][PERSONAL_PROPERTY] == {
        "subject": "user",
        "id_field": "author_id",
        "type": "string",
    }
    assert PERSONAL_PROPERTY not in fields["author_id"] and fields["author_id"]["type"] == "long"
    assert all(PERSONAL_PROPERTY not in f for f in avro_schema(PostLiked)["fields"])


def test_the_codec_encrypts_personal_fields_and_needs_keys_for_them() -> None:
    registry = MemoryRegistry()
    codec = EventCodec(EventRegistry(POST_EVENTS))
    codec.register_schemas(registry)
    keys = MemoryKeys()
    event = PostCreated(1, 42, "my secret #kafka", ("kafka",), WHEN)
    new = codec.encode(event, {}, keys)
    assert new.data["text"].startswith("tx1:") and new.data["hashtags"] == ["kafka"]
    assert decrypt(keys.key_for(U), new.data["text"], U, "text") == "my secret #kafka"
    assert new.payload_head is not None and b"my secret" not in new.payload_head
    with pytest.raises(EventStoreError, match="personal fields"):
        codec.encode(event)  # no keys: never written in plain
    keys.forget(U)
    with pytest.raises(SubjectForgottenError):
        codec.encode(event, {}, keys)


def _record(registry: MemoryRegistry, data: dict[str, object], version: int) -> bytes:
    codec_ids = {c.event_name: c for c in POST_EVENTS}
    from event_store.schemas import register_event_schemas

    ids = register_event_schemas(POST_EVENTS, registry)
    row = {
        "event_id": str(uuid.uuid4()),
        "event_type": "PostCreated",
        "schema_version": codec_ids["PostCreated"].schema_version,
        "stream_type": "post",
        "stream_id": f"post-{data['post_id']}",
        "version": version,
        "position": 5,
        "recorded_at": "2026-01-02T03:04:05Z",
        "data": json.dumps(data),
        "metadata": "{}",
        "schema_id": ids[("PostCreated", 2)],
    }
    [out] = EventOutbox(registry).route(json.dumps({"op": "c", "after": row}), b"1")
    assert out.value is not None
    return out.value


def test_the_social_fold_decrypts_and_drops_what_names_a_forgotten_user() -> None:
    registry = MemoryRegistry()
    schemas = SchemaCache(registry.schema_text)
    keys = MemoryKeys()
    other = ("user", "7")

    def post(post_id: int, author: tuple[str, str], text: str) -> bytes:
        token = encrypt(keys.key_for(author), text, author, "text")
        data = {
            "post_id": post_id,
            "author_id": int(author[1]),
            "text": token,
            "hashtags": [],
            "created_at": "2026-01-02T03:04:05Z",
        }
        return _record(registry, data, 1)

    values = [post(1, U, "by U"), post(2, other, "by seven")]
    event = decode_event(values[0], schemas)
    assert event["personal"] and isinstance(event["data"]["text"], str)
    assert event["data"]["text"].startswith("tx1:")  # still encrypted after decoding
    assert open_event(event, keys.lookup({U}))["data"]["text"] == "by U"

    def fold() -> dict[str, object]:
        table = pa.table(
            {
                "topic": ["events.post"] * 2,
                "partition": pa.array([0, 0], pa.int32()),
                "offset": pa.array([0, 1], pa.int64()),
                "value": pa.array(values, pa.binary()),
            }
        )
        [batch, rejected] = _fold_events(table, {POSTS, FORGOTTEN}, schemas, keys.lookup)
        assert rejected is None
        rows = batch.to_pylist()
        return {r["key"]: None if r["deleted"] else json.loads(r["fields"])["text"] for r in rows}

    assert fold() == {"1": "by U", "2": "by seven"}
    keys.forget(U)
    assert fold() == {"1": None, "2": "by seven"}  # U's post folds into a removal


def test_the_app_tables_setting() -> None:
    assert parse_app_tables("user=public.users.id;public.orders.user_id, team=x.teams.id") == {
        "user": [AppColumn("public.users", "id"), AppColumn("public.orders", "user_id")],
        "team": [AppColumn("x.teams", "id")],
    }
    with pytest.raises(ValueError):
        parse_app_tables("user=users.id")


def test_a_nul_character_in_personal_data_is_refused_as_the_database_would() -> None:
    from event_store.personal import Personal, UnstorableValueError, encrypt_data

    with pytest.raises(UnstorableValueError, match=r"cannot store text.*22P05"):
        encrypt_data({"text": Personal("user", "a")}, {"a": 1, "text": "a\x00b"}, MemoryKeys())


@pytest.mark.parametrize("schema", ["keys; DROP TABLE x", "a.b", "", "9keys", 'k"s'])
def test_a_key_table_schema_that_is_not_a_plain_identifier_is_refused(schema: str) -> None:
    with pytest.raises(ValueError, match="not a plain SQL identifier"):
        key_for_sql(schema)
    with pytest.raises(ValueError, match="not a plain SQL identifier"):
        KeyReader("postgresql://unused", schema)
    assert "event_store.subject_keys" in key_for_sql("event_store")


@pytest.mark.parametrize(
    ("subject_type", "subject_id", "wrong"),
    [
        ("0", "42", "lower-case word"),
        ("user-a", "b", "lower-case word"),  # ("user-a", "b") and ("user", "a-b"): one stream
        ("User", "42", "lower-case word"),
        ("user", "", "without NUL"),
        ("user", "4\x002", "without NUL"),
    ],
)
def test_a_malformed_subject_is_refused_before_anything_is_read(
    subject_type: str, subject_id: str, wrong: str
) -> None:
    with pytest.raises(ValueError, match=wrong):
        check_subject(subject_type, subject_id)
    check_subject("user", "a-b")  # an id may hold anything else
