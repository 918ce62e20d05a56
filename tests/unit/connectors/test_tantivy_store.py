"""The tantivy store's helpers and what it adds to the contract (search, rejections, folders).

tantivy needs no service: these tests run the store on a temporary folder.
"""

import datetime as dt
import os
from pathlib import Path
from typing import Any

import pytest

from connectors.errors import StaleGenerationError, StoreError
from connectors.stores.tantivy import (
    LIVE,
    SearchField,
    TantivyStore,
    lookup_text,
    search_value,
    search_words,
    slug,
    uid,
)
from tributary.view_model import Batch, Delete, Put, Rejected
from tributary.view_store import Collection

COLLECTIONS = (Collection("docs", lookups=("tag",)), Collection("notes"))
FIELDS = (
    SearchField("title"),
    SearchField("tag", "keyword"),
    SearchField("at", "date"),
    SearchField("n", "integer"),
)


def offsets(end: int) -> dict[str, dict[str, int]]:
    return {"t": {"0": end}}


def doc(key: str, position: int, **fields: Any) -> Put:
    return Put("docs", key, position, fields)


@pytest.fixture
def store(tmp_path: Path) -> TantivyStore:
    return TantivyStore(tmp_path, "Search.View", COLLECTIONS, search_fields=FIELDS)


# -- helpers ------------------------------------------------------------------------------


def test_user_text_becomes_quoted_words() -> None:
    assert search_words('title:secret AND "x" OR (y*') == '"title" "secret" "AND" "x" "OR" "y"'
    assert search_words("  ") is None
    assert search_words(':"()') is None


def test_lookup_text_matches_postgres_text_of_a_json_value() -> None:
    assert lookup_text("x") == "x"
    assert lookup_text(True) == "true"
    assert lookup_text(3) == "3"
    assert lookup_text({"a": 1}) == '{"a": 1}'


def test_uids_of_entries_and_tombstones_differ() -> None:
    assert uid("entry", "docs", "k") != uid("tomb", "docs", "k")
    assert slug("Mirror.public.Users") == "mirror_public_users"


def test_search_values_are_typed() -> None:
    at = search_value(SearchField("at", "date"), "2024-05-01T10:00:00+02:00")
    assert at == dt.datetime(2024, 5, 1, 8, 0, tzinfo=dt.UTC)
    assert search_value(SearchField("n", "integer"), [1, 2]) == [1, 2]
    for field, value in [
        (SearchField("at", "date"), "yesterday"),
        (SearchField("n", "integer"), True),
        (SearchField("n", "integer"), "5"),
        (SearchField("title"), 5),
    ]:
        with pytest.raises(ValueError):
            search_value(field, value)


# -- the store ----------------------------------------------------------------------------


def test_search_ranks_live_entries_of_one_collection(store: TantivyStore) -> None:
    writer = store.writer(store.live_generation(), live=True)
    writer.apply(
        Batch(
            0,
            offsets(4),
            [
                doc("a", 1, title="Running dogs and running cats", tag="pets"),
                doc("b", 2, title="A dog", tag="Pets"),
                doc("c", 3, title="Nothing here"),
                Put("notes", "n", 4, {"title": "dogs everywhere"}),
            ],
        )
    )
    hits = store.search("run dog", ["title"], collection="docs")
    assert [e.key for _, e in hits] == ["a", "b"]
    assert hits[0][0] > hits[1][0] > 0
    assert hits[0][1].fields["tag"] == "pets" and hits[0][1].position == 1
    # Keywords match exactly; every text and keyword field when none is named.
    assert [e.key for _, e in store.search("Pets", ["tag"], collection="docs")] == ["b"]
    assert {e.key for _, e in store.search("pets nothing", [], collection="docs")} == {"a", "c"}
    # User input never raises nor reaches other fields.
    for text in ['"', "title:dog", "AND", "_kind:entry", "(((", "*", "tag:pets OR"]:
        store.search(text, ["title"], collection="docs")
    assert store.search("_uid:x", ["title"], collection="docs") == []
    assert store.search("  ", ["title"], collection="docs") == []
    # A deleted entry is no longer found.
    writer.apply(Batch(1, offsets(5), [Delete("docs", "b", 5)]))
    assert [e.key for _, e in store.search("dog", ["title"], collection="docs")] == ["a"]
    with pytest.raises(StoreError, match="not among the search fields"):
        store.search("dog", ["body"], collection="docs")
    writer.close()


def test_a_value_a_search_field_refuses_is_rejected_and_the_rest_applies(
    store: TantivyStore,
) -> None:
    writer = store.writer(store.live_generation(), live=True)
    got: list[Rejected] = []
    batch = Batch(
        0,
        offsets(3),
        [
            doc("ok", 1, title="fine", at="2024-01-02T03:04:05Z", n=7),
            doc("bad-date", 2, at="soon"),
            doc("bad-int", 3, n="seven"),
        ],
    )
    assert writer.apply(batch, on_rejected=got.extend)
    assert sorted(r.write.key for r in got) == ["bad-date", "bad-int"]
    assert "ISO-8601" in next(r.reason for r in got if r.write.key == "bad-date")
    assert [e.key for e in store.scan("docs")] == ["ok"]
    assert store.committed(store.live_generation()).offsets == offsets(3)
    writer.close()


def test_another_store_object_sees_commits_and_follows_a_swap(
    store: TantivyStore, tmp_path: Path
) -> None:
    other = TantivyStore(tmp_path, "Search.View", COLLECTIONS, search_fields=FIELDS)
    live = store.live_generation()
    assert other.live_generation() == live
    writer = store.writer(live, live=True)
    writer.apply(Batch(0, offsets(1), [doc("a", 1, title="one")]))
    assert [e.key for e in other.scan("docs")] == ["a"]
    shadow = "gshadow"
    store.prepare(shadow)
    assert store.generations() == {live, shadow}
    store.writer(shadow, live=False).apply(Batch(0, offsets(1), [doc("b", 1, title="two")]))
    assert [e.key for e in other.scan("docs")] == ["a"]
    assert other.swap_in(shadow) == live
    assert os.readlink(tmp_path / "search_view" / LIVE) == shadow
    assert not (tmp_path / "search_view" / live).exists()
    assert [e.key for e in store.scan("docs")] == ["b"]
    assert store.generations() == {shadow}
    with pytest.raises(StaleGenerationError):
        writer.apply(Batch(1, offsets(2), [doc("c", 2, title="three")]))
    with pytest.raises(StoreError, match=live):
        store.committed(live)
    with pytest.raises(StoreError, match="is live"):
        store.discard(shadow)
    store.close()
    other.close()


def test_one_writer_per_generation_across_store_objects(
    store: TantivyStore, tmp_path: Path
) -> None:
    live = store.live_generation()
    first = store.writer(live, live=True)
    first.apply(Batch(0, offsets(1), [doc("a", 1)]))
    # Writers of one store object share the generation's IndexWriter ...
    second = store.writer(live, live=True)
    assert second.apply(Batch(1, offsets(2), [doc("b", 2)]))
    # ... another object (another process) waits until they are closed.
    other = TantivyStore(tmp_path, "Search.View", COLLECTIONS, search_fields=FIELDS)
    blocked = other.writer(live, live=True)
    with pytest.raises(StoreError, match="another writer"):
        blocked.apply(Batch(2, offsets(3), [doc("c", 3)]))
    first.close()
    second.close()
    assert blocked.apply(Batch(2, offsets(3), [doc("c", 3)]))
    assert [e.key for e in store.scan("docs")] == ["a", "b", "c"]
    blocked.close()


def test_a_changed_schema_is_refused_for_writes_but_read(
    store: TantivyStore, tmp_path: Path
) -> None:
    live = store.live_generation()
    writer = store.writer(live, live=True)
    writer.apply(Batch(0, offsets(1), [doc("a", 1, title="one")]))
    writer.close()
    changed = TantivyStore(tmp_path, "Search.View", COLLECTIONS, search_fields=FIELDS[:1])
    assert [e.key for e in changed.scan("docs")] == ["a"]
    with pytest.raises(StoreError, match="another schema"):
        changed.writer(live, live=True).apply(Batch(1, offsets(2), [doc("b", 2)]))


def test_unknown_names_are_refused(store: TantivyStore) -> None:
    with pytest.raises(StoreError, match="no collection"):
        store.scan("nope")
    with pytest.raises(StoreError, match="not a generation name"):
        store.committed("../etc")
    with pytest.raises(StoreError, match="does not exist"):
        store.scan("docs", generation="gmissing")
    assert store.scan("docs") == []  # no live generation yet: an empty view
    with pytest.raises(StoreError, match="store's own"):
        TantivyStore(Path("/nonexistent"), "v", COLLECTIONS, search_fields=[SearchField("_kind")])
