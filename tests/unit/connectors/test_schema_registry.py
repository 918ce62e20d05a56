"""The registry's semantics over an in-memory log, its record format, and its REST API (no
broker: the integration tests run the same API on the compacted topic)."""

import json
from typing import Any

import pytest
from fastapi.testclient import TestClient

from connectors.avro import AvroDecodeError, SchemaCache
from connectors.schema_registry import MemoryLog, ParsedSchema, RegistryState, SchemaRegistry
from connectors.schema_registry.api import create_registry_app
from connectors.schema_registry.client import CONTENT_TYPE, RegistryClient
from connectors.schema_registry.errors import (
    IncompatibleSchemaError,
    InvalidSchemaError,
    RegistryStoreError,
    RegistryUnavailableError,
    SchemaNotFoundError,
    SubjectNotFoundError,
)
from connectors.schema_registry.records import config_key, schema_key

V1 = {
    "type": "record",
    "name": "Post",
    "namespace": "t",
    "fields": [{"name": "id", "type": "string"}],
}
V2_OPTIONAL = {
    **V1,
    "fields": [*V1["fields"], {"name": "note", "type": ["null", "string"], "default": None}],
}
V2_REQUIRED = {**V1, "fields": [*V1["fields"], {"name": "n", "type": "int"}]}
OTHER = {"type": "record", "name": "User", "fields": [{"name": "name", "type": "string"}]}


def schema(definition: Any, **extra: Any) -> ParsedSchema:
    return ParsedSchema(json.dumps(definition, **extra), None, [])


def fresh() -> tuple[SchemaRegistry, MemoryLog]:
    state = RegistryState()
    log = MemoryLog(state)
    return SchemaRegistry(state, log), log


def replayed(log: MemoryLog) -> SchemaRegistry:
    """A new registry folding the same records (a restart on the same topic)."""
    state = RegistryState()
    for key, value in log.records:
        state.apply(key, value)
    return SchemaRegistry(state, MemoryLog(state))


def test_register_is_idempotent_and_ids_are_global() -> None:
    registry, _ = fresh()
    first = registry.register("posts-value", schema(V1))
    assert registry.register("posts-value", schema(V1, indent=2)) == first  # same schema
    assert registry.register("mirror-value", schema(V1)) == first  # same id in another subject
    second = registry.register("posts-value", schema(V2_OPTIONAL))
    assert second > first
    assert registry.version_numbers("posts-value") == [1, 2]
    assert registry.get_version("posts-value", "latest").id == second
    assert registry.get_version("posts-value", 1).id == first
    assert [(v.subject, v.version) for v in registry.versions_of_id(first)] == [
        ("mirror-value", 1),
        ("posts-value", 1),
    ]


def test_an_incompatible_version_is_refused_naming_the_field() -> None:
    registry, log = fresh()
    registry.register("posts-value", schema(V1))
    written = len(log.records)
    with pytest.raises(IncompatibleSchemaError) as err:
        registry.register("posts-value", schema(V2_REQUIRED))
    assert err.value.error_code == 409 and err.value.http_status == 409
    assert '\\"n\\"' in json.dumps(err.value.message) and "BACKWARD" in err.value.message
    assert len(log.records) == written  # nothing written
    registry.set_level("NONE", "posts-value")
    registry.register("posts-value", schema(V2_REQUIRED))  # the subject's own level counts


def test_transitive_levels_check_every_version() -> None:
    registry, _ = fresh()
    registry.register("s", schema(V1))  # id: string
    registry.set_level("NONE", "s")
    registry.register("s", schema({**V1, "fields": [{"name": "id", "type": "int"}]}))
    as_long = schema({**V1, "fields": [{"name": "id", "type": "long"}]})
    registry.set_level("BACKWARD_TRANSITIVE", "s")
    with pytest.raises(IncompatibleSchemaError, match="oldSchemaVersion: 1"):
        registry.register("s", as_long)  # version 1 wrote id as a string
    registry.set_level("BACKWARD", "s")
    assert registry.register("s", as_long) == 3  # the latest (int) promotes to long


def test_lookup_and_not_found_codes() -> None:
    registry, _ = fresh()
    with pytest.raises(SubjectNotFoundError):
        registry.lookup("s", schema(V1))
    registry.register("s", schema(V1))
    assert registry.lookup("s", schema(V1)).version == 1
    with pytest.raises(SchemaNotFoundError) as err:
        registry.lookup("s", schema(OTHER))
    assert err.value.error_code == 40403
    with pytest.raises(SchemaNotFoundError):
        registry.schema_by_id(99)


def test_only_avro_is_accepted() -> None:
    with pytest.raises(InvalidSchemaError, match="PROTOBUF"):
        ParsedSchema('syntax = "proto3";', "PROTOBUF", [])
    with pytest.raises(InvalidSchemaError, match="not JSON"):
        ParsedSchema("{", None, [])
    with pytest.raises(InvalidSchemaError, match="Avro"):
        ParsedSchema('{"type": "record", "fields": []}', None, [])
    with pytest.raises(InvalidSchemaError, match="references"):
        ParsedSchema(json.dumps(V1), "AVRO", [{"name": "x", "subject": "y", "version": 1}])


def test_the_state_survives_a_restart_with_new_ids_after_the_old_ones() -> None:
    registry, log = fresh()
    a = registry.register("a", schema(V1))
    b = registry.register("b", schema(OTHER))
    registry.set_level("FULL", "a")
    registry.set_level("FORWARD", None)
    registry.delete_version("b", 1)
    again = replayed(log)
    assert again.subject_names() == ["a"]
    assert again.subject_names(deleted=True) == ["a", "b"]
    assert again.get_version("a", 1).id == a and again.schema_by_id(b).subject == "b"
    assert again.level("a") == "FULL" and again.level() == "FORWARD"
    assert again.register("c", schema({"type": "enum", "name": "E", "symbols": ["X"]})) > b


def test_soft_then_permanent_deletes() -> None:
    registry, log = fresh()
    registry.register("s", schema(V1))
    registry.register("s", schema(V2_OPTIONAL))
    with pytest.raises(Exception) as not_first:
        registry.delete_subject("s", permanent=True)
    assert getattr(not_first.value, "error_code", None) == 40405
    assert registry.delete_subject("s") == [1, 2]
    assert registry.subject_names() == []
    with pytest.raises(Exception) as twice:
        registry.delete_subject("s")
    assert getattr(twice.value, "error_code", None) == 40404
    assert replayed(log).subject_names(deleted=True) == ["s"]  # DELETE_SUBJECT folds too
    assert registry.delete_subject("s", permanent=True) == [1, 2]
    assert registry.subject_names(deleted=True) == []
    assert replayed(log).subject_names(deleted=True) == []
    # A version: soft (40406 twice), then permanent (40407 when not soft-deleted first).
    registry.register("v", schema(V1))
    registry.register("v", schema(V2_OPTIONAL))
    with pytest.raises(Exception) as live:
        registry.delete_version("v", 2, permanent=True)
    assert getattr(live.value, "error_code", None) == 40407
    assert registry.delete_version("v", "latest") == 2
    with pytest.raises(Exception) as soft:
        registry.delete_version("v", 2)
    assert getattr(soft.value, "error_code", None) == 40406
    assert registry.delete_version("v", 2, permanent=True) == 2
    assert registry.version_numbers("v", deleted=True) == [1]
    assert registry.register("v", schema(V2_OPTIONAL)) > 0
    assert registry.version_numbers("v") == [1, 2]


def test_records_are_in_confluents_format() -> None:
    registry, log = fresh()
    registry.register("s", schema(V1))
    registry.set_level("FULL", None)
    (key, value), (ckey, cvalue) = log.records
    assert key == b'{"keytype":"SCHEMA","subject":"s","version":1,"magic":1}' == schema_key("s", 1)
    assert json.loads(value or b"") == {
        "subject": "s",
        "version": 1,
        "id": 1,
        "schema": json.dumps(V1, separators=(",", ":")),
        "deleted": False,
    }
    assert ckey == b'{"keytype":"CONFIG","subject":null,"magic":0}' == config_key(None)
    assert json.loads(cvalue or b"") == {"compatibilityLevel": "FULL"}


def test_foreign_records_on_the_topic_are_skipped() -> None:
    state = RegistryState()
    state.apply(b"a1b2c3d4e5f60718", b'{"type":"record","name":"Event","fields":[]}')
    state.apply(b"1234567890123456", b"{}")
    state.apply(b'{"keytype":"NOOP","magic":0}', None)
    assert state.subjects == {} and state.skipped == 2


# -- the REST API ---------------------------------------------------------------------------


@pytest.fixture
def client() -> TestClient:
    registry, _ = fresh()
    return TestClient(create_registry_app(registry))


def post(client: TestClient, path: str, definition: Any) -> Any:
    return client.post(
        path,
        content=json.dumps({"schema": json.dumps(definition)}),
        headers={"Content-Type": CONTENT_TYPE, "Accept": CONTENT_TYPE},
    )


def test_rest_register_read_and_lookup(client: TestClient) -> None:
    answer = post(client, "/subjects/posts-value/versions", V1)
    assert answer.status_code == 200 and answer.json() == {"id": 1}
    assert answer.headers["content-type"] == CONTENT_TYPE
    assert client.get("/subjects").json() == ["posts-value"]
    assert client.get("/subjects/posts-value/versions").json() == [1]
    latest = client.get("/subjects/posts-value/versions/latest").json()
    assert latest["id"] == 1 and latest["version"] == 1 and json.loads(latest["schema"]) == V1
    assert json.loads(client.get("/subjects/posts-value/versions/1/schema").text) == V1
    assert json.loads(client.get("/schemas/ids/1").json()["schema"]) == V1
    assert client.get("/schemas/ids/1/versions").json() == [
        {"subject": "posts-value", "version": 1}
    ]
    assert post(client, "/subjects/posts-value", V1).json()["version"] == 1


@pytest.mark.parametrize(
    ("method", "path", "status", "code"),
    [
        ("get", "/subjects/nope/versions", 404, 40401),
        ("get", "/subjects/posts-value/versions/7", 404, 40402),
        ("get", "/subjects/posts-value/versions/zero", 422, 42202),
        ("get", "/schemas/ids/42", 404, 40403),
        ("get", "/config/posts-value", 404, 40408),
        ("get", "/no/such/route", 404, 404),
    ],
)
def test_rest_errors_carry_confluents_codes(
    client: TestClient, method: str, path: str, status: int, code: int
) -> None:
    post(client, "/subjects/posts-value/versions", V1)
    answer = client.request(method, path)
    assert answer.status_code == status
    assert answer.json()["error_code"] == code and answer.json()["message"]


def test_rest_compatibility_config_and_refusal(client: TestClient) -> None:
    post(client, "/subjects/s/versions", V1)
    check = post(client, "/compatibility/subjects/s/versions/latest?verbose=True", V2_REQUIRED)
    assert check.json()["is_compatible"] is False
    assert any("READER_FIELD_MISSING_DEFAULT_VALUE" in m for m in check.json()["messages"])
    fine = post(client, "/compatibility/subjects/s/versions/1", V2_OPTIONAL).json()
    assert fine == {"is_compatible": True}
    refused = post(client, "/subjects/s/versions", V2_REQUIRED)
    assert refused.status_code == 409 and refused.json()["error_code"] == 409
    assert client.get("/config").json() == {"compatibilityLevel": "BACKWARD"}
    assert client.put("/config/s", json={"compatibility": "none"}).json() == {
        "compatibility": "NONE"
    }
    assert client.get("/config/s").json() == {"compatibilityLevel": "NONE"}
    bad = client.put("/config", json={"compatibility": "SIDEWAYS"})
    assert bad.status_code == 422 and bad.json()["error_code"] == 42203
    invalid = client.post("/subjects/s/versions", json={"schema": "{}", "schemaType": "JSON"})
    assert invalid.status_code == 422 and invalid.json()["error_code"] == 42201
    assert "Avro" in invalid.json()["message"]
    assert post(client, "/subjects/s/versions", V2_REQUIRED).json() == {"id": 2}


class BrokenLog(MemoryLog):
    """A store whose Kafka cannot be written: every registration fails on the server."""

    def append(self, key: bytes, value: bytes | None) -> None:
        raise RegistryStoreError("writing to _schemas failed: broker transport failure")


def test_a_server_error_is_unavailability_not_the_callers_fault() -> None:
    """A 5xx (our registry's store down, a proxy's 502/503) must make readers retry, never
    dead-letter a record as undecodable; a 4xx stays the request's own error."""
    state = RegistryState()
    app = create_registry_app(SchemaRegistry(state, BrokenLog(state)))
    client = RegistryClient(
        "http://testserver", http=TestClient(app, raise_server_exceptions=False)
    )
    with pytest.raises(RegistryUnavailableError, match="answered 500") as down:
        client.register("posts-value", json.dumps(V1))
    assert down.value.error_code == 50001
    cache = SchemaCache(client.schema_text)
    with pytest.raises(AvroDecodeError, match="schema id 7"):  # 404: the record's own fault
        cache.schema(7)
