"""The PostgreSQL view store: collections as tables, the ledger in the same transaction.

Ledger tables (in the views schema): ``_tributary_live (view, generation)`` names each view's
live generation; ``_tributary_ledger (view, generation, batch_id, offsets, batches)`` holds,
per generation, the last batch applied and the offsets it reached.

One batch is one transaction (the unit of :class:`~connectors.stores.protocol.BatchWriter`,
which runs the protocol): hold the view's live row shared (a swap waits), lock the generation's
ledger row, COPY the batch's write table into a staging table (CSV written by Arrow from the
columns, no Python object per write), apply it per collection with the position guard, the
tombstones and the applied counts in one merge statement each, run the view's materializer,
update the ledger, commit. A write whose value a column refuses (SQLSTATE classes 22 and 23) is
found by halving the batch in savepoints; it is handed to ``on_rejected`` and the rest of the
batch is applied.

Generations: the live generation's tables carry the base names; a shadow generation's tables
are ``<base>__<generation>``. A swap renames them in one transaction; readers of the base names
see the old or the new table, never an error.
"""

import json
import logging
import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from functools import cache
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql

from connectors.errors import StoreError
from connectors.stores.compare import entry_digest
from connectors.stores.pg_tables import (
    APPLIED,
    META_COLUMNS,
    POSITION,
    TypedColumn,
    TypedTable,
    deleted_table,
    generation_table,
    ident,
)
from connectors.stores.protocol import BatchUnit, BatchWriter, named
from connectors.stores.writes import WriteColumns
from tributary.view_model import (
    Applied,
    Batch,
    Commit,
    Entry,
    JsonObject,
    Rejected,
    fields_json,
)
from tributary.view_store import Collection, CommitHooks, Materializer

if TYPE_CHECKING:  # the writer's, with its first batch: not for a store's readers
    import numpy as np
    import pyarrow as pa  # type: ignore[import-untyped]

log = logging.getLogger(__name__)

Layout = Collection | TypedTable

_SCHEMA_LOCK = 0x7472_6962  # advisory lock: concurrent first runs create the ledger once
_STAGE = sql.Identifier("_tributary_stage")
_DATA_ERRORS = ("22", "23")  # data exceptions, integrity violations: this write's fault
_WORK_MEM = "SET LOCAL work_mem = '64MB'"
_STAGED_ROW = sql.SQL("(CASE WHEN s.m IS NULL THEN s.r ELSE s.r -> s.m END)")


def slug(name: str) -> str:
    """A name safe inside an SQL identifier (``mirror.public.users`` -> ``mirror_public_users``)."""
    return re.sub(r"[^a-z0-9_]", "_", name.lower())


class PostgresStore:
    """A view's state in PostgreSQL tables of ``schema``."""

    kind = "postgres"

    def __init__(
        self,
        dsn: str,
        schema: str,
        view: str,
        collections: Sequence[Layout],
        materializer: Materializer | None = None,
        table_prefix: str | None = None,
    ) -> None:
        self.dsn = dsn
        self.schema = schema
        self.view = view
        self.materializer = materializer
        self.prefix = table_prefix or slug(view)
        self._ledger_ready = False  # ensure_ledger ran once for this store object
        self.layouts: dict[str, Layout] = {}
        for layout in collections:
            name = layout.collection if isinstance(layout, TypedTable) else layout.name
            self.layouts[name] = layout

    # -- naming ------------------------------------------------------------------------

    def base_table(self, collection: str) -> str:
        layout = self.layouts.get(collection)
        if layout is None:
            layout = self._layout(collection)  # raises, naming the collections
        if isinstance(layout, TypedTable):
            return layout.table
        return f"{self.prefix}__{collection}"

    def table(self, collection: str, generation: str | None) -> str:
        """The table of a collection in a generation (None: the live one)."""
        return generation_table(self.base_table(collection), generation)

    def _layout(self, collection: str) -> Layout:
        layout = named(self.view, self.layouts, collection)
        if isinstance(layout, TypedTable) and (not layout.columns or not layout.key):
            if layout.refresh is not None:
                layout = layout.refresh()
            if not layout.columns or not layout.key:
                raise StoreError(
                    f"view {self.view}: the layout of {layout.table} has no"
                    f" {'columns' if not layout.columns else 'primary key'} (does the source"
                    " table exist, with a primary key?)"
                )
            self.layouts[collection] = layout
        return layout

    def _t(self, name: str) -> sql.Composed:
        return ident(self.schema, name)

    # -- connections and the ledger ----------------------------------------------------

    @contextmanager
    def _transaction(self) -> Iterator[psycopg.Connection[Any]]:
        try:
            with (
                psycopg.connect(self.dsn, autocommit=False, connect_timeout=10) as conn,
                conn.transaction(),
            ):
                if not self._ledger_ready:
                    ensure_ledger(conn, self.schema)
                    self._ledger_ready = True
                yield conn
        except psycopg.OperationalError as exc:
            raise StoreError(f"view {self.view}: PostgreSQL unreachable: {exc}") from exc

    def _shadow_of(self, conn: psycopg.Connection[Any], generation: str) -> str | None:
        """None when ``generation`` is live (base table names), else the generation."""
        live = live_generation(conn, self.schema, self.view)
        return None if live == generation else generation

    def live_generation(self) -> str:
        from tributary.view_store import new_generation

        with self._transaction() as conn:
            conn.execute(
                sql.SQL(
                    "INSERT INTO {} (view, generation) VALUES (%s, %s)"
                    " ON CONFLICT (view) DO NOTHING"
                ).format(self._t("_tributary_live")),
                (self.view, new_generation()),
            )
            live = live_generation(conn, self.schema, self.view)
            assert live is not None
            return live

    def committed(self, generation: str) -> Commit:
        with self._transaction() as conn:
            return read_commit(conn, self.schema, self.view, generation, lock=False)

    def writer(
        self, generation: str, *, live: bool, hooks: CommitHooks | None = None
    ) -> "PostgresWriter":
        return PostgresWriter(self, generation, live=live, hooks=hooks or CommitHooks())

    def prepare(self, generation: str) -> None:
        self.discard(generation)
        with self._transaction() as conn:
            register(conn, self.schema, self.view, generation)

    def generations(self) -> set[str]:
        with self._transaction() as conn:
            rows = conn.execute(
                sql.SQL(
                    "SELECT generation FROM {} WHERE view = %s"
                    " UNION SELECT generation FROM {} WHERE view = %s"
                ).format(self._t("_tributary_ledger"), self._t("_tributary_live")),
                (self.view, self.view),
            ).fetchall()
        return {str(r[0]) for r in rows}

    def discard(self, generation: str) -> None:
        with self._transaction() as conn:
            if live_generation(conn, self.schema, self.view) == generation:
                raise StoreError(f"view {self.view}: generation {generation} is live; not dropped")
            for collection in self.layouts:
                self._drop(conn, self.table(collection, generation))
            forget(conn, self.schema, self.view, generation)

    def swap_in(self, generation: str) -> str | None:
        with self._transaction() as conn:
            row = conn.execute(
                sql.SQL("SELECT generation FROM {} WHERE view = %s FOR UPDATE").format(
                    self._t("_tributary_live")
                ),
                (self.view,),
            ).fetchone()
            previous = None if row is None else str(row[0])
            if previous == generation:
                return previous
            for collection in self.layouts:
                base = self.base_table(collection)
                retired = f"{base}__retired"
                self._drop(conn, retired)
                self._rename(conn, base, retired)
                self._rename(conn, generation_table(base, generation), base)
                self._drop(conn, retired)
            conn.execute(
                sql.SQL(
                    "INSERT INTO {} (view, generation) VALUES (%s, %s) ON CONFLICT (view)"
                    " DO UPDATE SET generation = EXCLUDED.generation, swapped_at = now()"
                ).format(self._t("_tributary_live")),
                (self.view, generation),
            )
            if previous is not None:
                forget(conn, self.schema, self.view, previous)
            return previous

    def _drop(self, conn: psycopg.Connection[Any], table: str) -> None:
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(self._t(table)))
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(self._t(deleted_table(table))))

    def _rename(self, conn: psycopg.Connection[Any], old: str, new: str) -> None:
        for a, b in ((old, new), (deleted_table(old), deleted_table(new))):
            conn.execute(
                sql.SQL("ALTER TABLE IF EXISTS {} RENAME TO {}").format(
                    self._t(a), sql.Identifier(b)
                )
            )

    # -- reads -------------------------------------------------------------------------

    def get(self, collection: str, key: str, generation: str | None = None) -> Entry | None:
        with self._transaction() as conn:
            shadow = None if generation is None else self._shadow_of(conn, generation)
            return TableAccess(self, conn, shadow).get(collection, key)

    def scan(self, collection: str, generation: str | None = None) -> list[Entry]:
        with self._transaction() as conn:
            shadow = None if generation is None else self._shadow_of(conn, generation)
            return TableAccess(self, conn, shadow).scan(collection)

    def digests(self, generation: str | None = None) -> Iterator[tuple[str, str, str]]:
        """Every collection's entries read in one transaction (one snapshot of the ledger's
        view of the generation's tables), digested."""
        with self._transaction() as conn:
            shadow = None if generation is None else self._shadow_of(conn, generation)
            access = TableAccess(self, conn, shadow)
            listed = {c: access.scan(c) for c in sorted(self.layouts)}
        for collection, entries in listed.items():
            for entry in sorted(entries, key=lambda e: e.key):
                yield collection, entry.key, entry_digest(entry)

    def describe(self) -> str:
        tables = ", ".join(f"{self.schema}.{self.base_table(c)}" for c in self.layouts)
        return f"postgres {tables}"

    def close(self) -> None:
        """Nothing is held between calls."""


# -- ledger statements (shared by the store and its writers) ----------------------------


def ensure_ledger(conn: psycopg.Connection[Any], schema: str) -> None:
    conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
    conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
    conn.execute(
        sql.SQL(
            "CREATE TABLE IF NOT EXISTS {} (view text PRIMARY KEY, generation text NOT NULL,"
            " swapped_at timestamptz NOT NULL DEFAULT now())"
        ).format(ident(schema, "_tributary_live"))
    )
    conn.execute(
        sql.SQL(
            "CREATE TABLE IF NOT EXISTS {} (view text NOT NULL, generation text NOT NULL,"
            " batch_id bigint NOT NULL DEFAULT -1, offsets jsonb NOT NULL DEFAULT '{{}}',"
            " batches bigint NOT NULL DEFAULT 0, updated_at timestamptz NOT NULL DEFAULT now(),"
            " PRIMARY KEY (view, generation))"
        ).format(ident(schema, "_tributary_ledger"))
    )


def live_generation(conn: psycopg.Connection[Any], schema: str, view: str) -> str | None:
    row = conn.execute(
        sql.SQL("SELECT generation FROM {} WHERE view = %s").format(
            ident(schema, "_tributary_live")
        ),
        (view,),
    ).fetchone()
    return None if row is None else str(row[0])


def register(conn: psycopg.Connection[Any], schema: str, view: str, generation: str) -> None:
    conn.execute(
        sql.SQL("INSERT INTO {} (view, generation) VALUES (%s, %s) ON CONFLICT DO NOTHING").format(
            ident(schema, "_tributary_ledger")
        ),
        (view, generation),
    )


def forget(conn: psycopg.Connection[Any], schema: str, view: str, generation: str) -> None:
    conn.execute(
        sql.SQL("DELETE FROM {} WHERE view = %s AND generation = %s").format(
            ident(schema, "_tributary_ledger")
        ),
        (view, generation),
    )


def read_commit(
    conn: psycopg.Connection[Any], schema: str, view: str, generation: str, *, lock: bool
) -> Commit:
    if lock:
        register(conn, schema, view, generation)
    row = conn.execute(
        sql.SQL(
            "SELECT batch_id, offsets, batches FROM {} WHERE view = %s AND generation = %s"
            + (" FOR UPDATE" if lock else "")
        ).format(ident(schema, "_tributary_ledger")),
        (view, generation),
    ).fetchone()
    if row is None:
        return Commit.empty(view, generation)
    return Commit(view, generation, int(row[0]), dict(row[1] or {}), int(row[2]))


def ledger_positions(conn: psycopg.Connection[Any], schema: str) -> list[Commit]:
    """The live generation's commit of every view in ``schema`` (for status)."""
    rows = conn.execute(
        sql.SQL(
            "SELECT g.view, g.generation, coalesce(b.batch_id, -1), coalesce(b.offsets, '{{}}'),"
            " coalesce(b.batches, 0) FROM {} g LEFT JOIN {} b USING (view, generation)"
            " ORDER BY g.view"
        ).format(ident(schema, "_tributary_live"), ident(schema, "_tributary_ledger"))
    ).fetchall()
    return [Commit(str(r[0]), str(r[1]), int(r[2]), dict(r[3]), int(r[4])) for r in rows]


# -- the writer -------------------------------------------------------------------------


class PostgresWriter(BatchWriter):
    """Applies batches to one generation of a PostgreSQL view store."""

    def __init__(
        self, store: PostgresStore, generation: str, *, live: bool, hooks: CommitHooks
    ) -> None:
        super().__init__(store.view, store.materializer, generation, live=live, hooks=hooks)
        self.store = store
        self._conn: psycopg.Connection[Any] | None = None
        self._ready: set[str] = set()  # tables known to exist with their columns this session
        self._layouts: dict[str, TypedTable] = {}

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            try:
                self._conn = psycopg.connect(self.store.dsn, autocommit=False)
            except psycopg.OperationalError as exc:
                raise StoreError(f"view {self.store.view}: PostgreSQL unreachable: {exc}") from exc
            with self._conn.transaction():
                ensure_ledger(self._conn, self.store.schema)
                self._conn.execute(
                    sql.SQL(
                        "CREATE TEMP TABLE IF NOT EXISTS {} (coll text, k text, r jsonb, m text,"
                        " pos bigint, changes bigint[], fresh boolean, deleted boolean)"
                        " ON COMMIT DELETE ROWS"
                    ).format(_STAGE)
                )
            self._ready.clear()
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def committed(self) -> Commit:
        return self.store.committed(self.generation)

    @property
    def _shadow(self) -> str | None:
        return None if self.live else self.generation

    @contextmanager
    def unit(self, batch: Batch) -> Iterator["PostgresUnit"]:
        """One transaction; rolled back unless the unit commits."""
        conn = self._connection()
        unit = PostgresUnit(self, conn)
        try:
            yield unit
        except psycopg.Error as exc:
            self.close()
            raise StoreError(
                f"view {self.view}: batch {batch.batch_id} failed: {exc}"
                " (the batch is retried when the job restarts)"
            ) from exc
        except BaseException:
            self._rollback(conn)  # table creations included
            raise
        if not unit.committed:  # a batch the ledger covers: nothing was written
            self._rollback(conn, forget=False)

    def _rollback(self, conn: psycopg.Connection[Any], forget: bool = True) -> None:
        if forget:
            self._ready.clear()  # tables created in the unit are gone
        try:
            conn.rollback()
        except psycopg.Error:
            self.close()

    # -- writing -----------------------------------------------------------------------

    def write(
        self,
        conn: psycopg.Connection[Any],
        writes: WriteColumns,
        rejected: list[Rejected],
        want: bool,
    ) -> list[Applied]:
        """The guarded writes of the batch; rows a table refuses (SQLSTATE classes 22, 23)
        are found by halving the batch and go to ``rejected``."""
        import numpy as np

        if writes.n == 0:
            for collection in self.store.layouts:
                self._ensure(conn, collection)
            return []
        staged = stage_table(writes)
        return self._write_part(conn, writes, staged, np.arange(writes.n), rejected, want)

    def _write_part(
        self,
        conn: psycopg.Connection[Any],
        writes: WriteColumns,
        staged: "pa.Table",
        rows: "np.ndarray",
        rejected: list[Rejected],
        want: bool,
    ) -> list[Applied]:
        try:
            with conn.transaction():
                return self._write_rows(conn, writes, staged, rows, want)
        except psycopg.Error as exc:
            self._ready.clear()  # tables created in the rolled-back savepoint are gone
            if not _is_data_error(exc):
                raise
            if len(rows) == 1:
                write = writes.write(int(rows[0]))
                rejected.append(Rejected(write, f"{type(exc).__name__}: {exc}".strip()))
                return []
        half = len(rows) // 2
        return [
            *self._write_part(conn, writes, staged, rows[:half], rejected, want),
            *self._write_part(conn, writes, staged, rows[half:], rejected, want),
        ]

    def _write_rows(
        self,
        conn: psycopg.Connection[Any],
        writes: WriteColumns,
        staged: "pa.Table",
        rows: "np.ndarray",
        want: bool,
    ) -> list[Applied]:
        import numpy as np
        import pyarrow as pa

        part = staged if len(rows) == writes.n else staged.take(pa.array(rows, pa.int64()))
        with conn.cursor() as cur:
            cur.execute(sql.SQL("TRUNCATE {}").format(_STAGE))
            with cur.copy(
                sql.SQL(
                    "COPY {} (coll, k, r, m, pos, changes, fresh, deleted) FROM STDIN (FORMAT csv)"
                ).format(_STAGE)
            ) as copy:
                copy.write(csv_bytes(part))
        conn.execute(_WORK_MEM)  # the merges' hash joins and CTEs stay in memory
        applied: list[Applied] = []
        codes = writes.collection_codes[rows]
        for code in np.unique(codes):
            collection = writes.collections[int(code)]
            self._ensure(conn, collection)
            self._widen(conn, collection)
            result = conn.execute(self._apply_sql(collection, want), {"c": collection})
            if not want:
                continue
            mine = rows[codes == code]
            index = dict(zip(writes.column("key", mine), mine.tolist(), strict=True))
            generic = self._typed(collection) is None
            found = result.fetchall()
            objects = writes.writes([index[str(key)] for key, _ in found])
            for write, (_, before) in zip(objects, found, strict=True):
                fields = None if before is None else _fields_of(before, generic)
                applied.append(Applied(write, fields))
        return applied

    # -- table shapes ------------------------------------------------------------------

    def _typed(self, collection: str) -> TypedTable | None:
        layout = self.store._layout(collection)
        if not isinstance(layout, TypedTable):
            return None
        return self._layouts.setdefault(collection, layout)

    def _ensure(self, conn: psycopg.Connection[Any], collection: str) -> None:
        """Create the collection's tables in this generation if absent."""
        table = self.store.table(collection, self._shadow)
        if table in self._ready:
            return
        t, d = self.store._t(table), self.store._t(deleted_table(table))
        typed = self._typed(collection)
        if typed is None:
            conn.execute(
                sql.SQL(
                    "CREATE TABLE IF NOT EXISTS {} (key text PRIMARY KEY, {} bigint NOT NULL,"
                    " {} bigint NOT NULL, fields jsonb NOT NULL)"
                ).format(t, sql.Identifier(POSITION), sql.Identifier(APPLIED))
            )
            layout = self.store._layout(collection)
            assert isinstance(layout, Collection)
            for lookup in layout.lookups:
                conn.execute(
                    sql.SQL("CREATE INDEX IF NOT EXISTS {} ON {} ((fields ->> {}))").format(
                        sql.Identifier(f"{table}__{lookup}"[:63]), t, sql.Literal(lookup)
                    )
                )
        else:
            existing = _columns(conn, self.store.schema, table)
            if not existing:
                defs = [
                    sql.SQL("{} {}").format(sql.Identifier(c.name), sql.SQL(c.sql_type))
                    for c in typed.columns
                ]
                defs += [
                    sql.SQL("{} bigint NOT NULL").format(sql.Identifier(POSITION)),
                    sql.SQL("{} bigint NOT NULL").format(sql.Identifier(APPLIED)),
                    sql.SQL("PRIMARY KEY ({})").format(
                        sql.SQL(", ").join(map(sql.Identifier, typed.key))
                    ),
                ]
                conn.execute(
                    sql.SQL("CREATE TABLE IF NOT EXISTS {} ({})").format(
                        t, sql.SQL(", ").join(defs)
                    )
                )
            else:
                self._add_columns(conn, collection, typed, existing)
        conn.execute(
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} (key text PRIMARY KEY, {} bigint NOT NULL)"
            ).format(d, sql.Identifier(POSITION))
        )
        self._ready.add(table)

    def _add_columns(
        self,
        conn: psycopg.Connection[Any],
        collection: str,
        typed: TypedTable,
        existing: dict[str, str],
    ) -> None:
        table = self.store.table(collection, self._shadow)
        for column in typed.columns:
            if column.name not in existing:
                conn.execute(
                    sql.SQL("ALTER TABLE {} ADD COLUMN IF NOT EXISTS {} {}").format(
                        self.store._t(table), sql.Identifier(column.name), sql.SQL(column.sql_type)
                    )
                )

    def _widen(self, conn: psycopg.Connection[Any], collection: str) -> None:
        """Add the columns of fields a typed table lacks (a column added at the source)."""
        typed = self._typed(collection)
        if typed is None:
            return
        rows = conn.execute(
            sql.SQL(
                "SELECT DISTINCT jsonb_object_keys({}) FROM {} s"
                " WHERE s.coll = %s AND NOT s.deleted"
            ).format(_STAGED_ROW, _STAGE),
            (collection,),
        ).fetchall()
        unknown = {str(r[0]) for r in rows} - {c.name for c in typed.columns}
        if not unknown:
            return
        columns = list(typed.columns)
        fresh = {c.name: c for c in (typed.refresh().columns if typed.refresh is not None else [])}
        for name in sorted(unknown):
            column = fresh.get(name)
            if column is None:
                log.warning(
                    "view %s: field %s of %s is not in the source catalog; kept as jsonb",
                    self.store.view,
                    name,
                    collection,
                )
                column = TypedColumn(name, "jsonb", "json_value")
            columns.append(column)
        typed = typed.with_columns(columns)
        self._layouts[collection] = typed
        table = self.store.table(collection, self._shadow)
        self._add_columns(conn, collection, typed, _columns(conn, self.store.schema, table))

    # -- the guarded apply statement ---------------------------------------------------

    def _apply_sql(self, collection: str, want: bool) -> sql.Composed:
        """The guarded merge of the staged writes of ``collection``; returns each applied
        key with its row before (``want``), else the number applied."""
        table = self.store.table(collection, self._shadow)
        t, d = self.store._t(table), self.store._t(deleted_table(table))
        pos, app = sql.Identifier(POSITION), sql.Identifier(APPLIED)
        applied = sql.SQL(
            "CASE WHEN g.fresh AND g.changes[1] > g.floor THEN g.n ELSE coalesce(g.tapp, 0) + g.n"
            " END"
        )
        typed = self._typed(collection)
        match: sql.Composable
        target_match: sql.Composable
        # Rows the batch finds in the table are updated, the others inserted: both sets are
        # known from the join (the ledger row's lock keeps other writers of the generation
        # out), which costs half of an INSERT ... ON CONFLICT DO UPDATE.
        if typed is None:
            match = sql.SQL("t.key = s.k")
            target_match = sql.SQL("t.key = g.k")
            write = sql.SQL(
                " updated AS (UPDATE {t} t SET {pos} = g.pos, {app} = {applied},"
                " fields = g.r::jsonb FROM g"
                " WHERE NOT g.deleted AND g.tpos IS NOT NULL AND {target_match}),"
                " inserted AS (INSERT INTO {t} (key, {pos}, {app}, fields)"
                " SELECT g.k, g.pos, {applied}, g.r::jsonb FROM g"
                " WHERE NOT g.deleted AND g.tpos IS NULL)"
            ).format(t=t, pos=pos, app=app, applied=applied, target_match=target_match)
        else:
            key_of = {c: _key_column(typed, c) for c in typed.key}
            match = sql.SQL(" AND ").join(
                sql.SQL("t.{} = {}").format(
                    sql.Identifier(c), key_of[c].value_sql(sql.SQL("s.k::jsonb"))
                )
                for c in typed.key
            )
            target_match = sql.SQL(" AND ").join(
                sql.SQL("t.{} = {}").format(
                    sql.Identifier(c), key_of[c].value_sql(sql.SQL("g.k::jsonb"))
                )
                for c in typed.key
            )
            columns = list(typed.columns)
            source = sql.SQL("g.r::jsonb")
            names = sql.SQL(", ").join(sql.Identifier(c.name) for c in columns)
            values = sql.SQL(", ").join(c.value_sql(source) for c in columns)
            sets = [
                sql.SQL("{} = {}").format(sql.Identifier(c.name), c.value_sql(source))
                for c in columns
                if c.name not in typed.key
            ]
            sets += [
                sql.SQL("{} = g.pos").format(pos),
                sql.SQL("{} = {}").format(app, applied),
            ]
            write = sql.SQL(
                " updated AS (UPDATE {t} t SET {sets} FROM g"
                " WHERE NOT g.deleted AND g.tpos IS NOT NULL AND {target_match}),"
                " inserted AS (INSERT INTO {t} ({names}, {pos}, {app})"
                " SELECT {values}, g.pos, {applied} FROM g"
                " WHERE NOT g.deleted AND g.tpos IS NULL)"
            ).format(
                t=t,
                sets=sql.SQL(", ").join(sets),
                target_match=target_match,
                names=names,
                values=values,
                pos=pos,
                app=app,
                applied=applied,
            )
        return sql.SQL(
            "WITH f AS ("
            " SELECT s.k, {row} AS r, s.pos, s.changes, s.fresh, s.deleted,"
            " t.{pos} AS tpos, t.{app} AS tapp, d.{pos} AS dpos, {before} AS before,"
            " GREATEST(coalesce(t.{pos}, -1), coalesce(d.{pos}, -1)) AS floor"
            " FROM {stage} s LEFT JOIN {t} t ON {match} LEFT JOIN {d} d ON d.key = s.k"
            " WHERE s.coll = %(c)s),"
            " g AS (SELECT f.*, (SELECT count(*) FROM unnest(f.changes) a WHERE a > f.floor) AS n"
            " FROM f WHERE f.pos > f.floor),"
            " removed AS (DELETE FROM {t} t USING g WHERE g.deleted AND {target_match}),"
            " tombs AS (INSERT INTO {d} (key, {pos}) SELECT g.k, g.pos FROM g WHERE g.deleted"
            " ON CONFLICT (key) DO UPDATE SET {pos} = EXCLUDED.{pos}),"
            " revived AS (DELETE FROM {d} x USING g WHERE NOT g.deleted AND x.key = g.k),"
            "{write}"
            " SELECT {result} FROM g"
        ).format(
            row=_STAGED_ROW,
            before=sql.SQL("to_jsonb(t)") if want else sql.SQL("NULL::jsonb"),
            result=sql.SQL("g.k, g.before") if want else sql.SQL("count(*)"),
            pos=pos,
            app=app,
            stage=_STAGE,
            t=t,
            d=d,
            match=match,
            target_match=target_match,
            write=write,
        )


class PostgresUnit(BatchUnit):
    """One batch's transaction on a PostgreSQL store."""

    def __init__(self, writer: PostgresWriter, conn: psycopg.Connection[Any]) -> None:
        self.writer = writer
        self.store = writer.store
        self.conn = conn
        self.committed = False

    def live_generation(self) -> str | None:
        # Held shared until the commit: a swap waits for this batch.
        row = self.conn.execute(
            sql.SQL("SELECT generation FROM {} WHERE view = %s FOR SHARE").format(
                self.store._t("_tributary_live")
            ),
            (self.store.view,),
        ).fetchone()
        return None if row is None else str(row[0])

    def ledger(self) -> Commit:
        store = self.store
        return read_commit(self.conn, store.schema, store.view, self.writer.generation, lock=True)

    def write(self, writes: WriteColumns, rejected: list[Rejected], applied: bool) -> list[Applied]:
        return self.writer.write(self.conn, writes, rejected, applied)

    def txn(self) -> "TableAccess":
        writer = self.writer
        return TableAccess(self.store, self.conn, writer._shadow, writer._ensure)

    def record(self, commit: Commit) -> None:
        self.conn.execute(
            sql.SQL(
                "UPDATE {} SET batch_id = %s, offsets = %s::jsonb, batches = %s,"
                " updated_at = now() WHERE view = %s AND generation = %s"
            ).format(self.store._t("_tributary_ledger")),
            (
                commit.batch_id,
                json.dumps(commit.offsets),
                commit.batches,
                commit.view,
                commit.generation,
            ),
        )

    def commit(self) -> None:
        self.conn.commit()
        self.committed = True


# -- staging ----------------------------------------------------------------------------


@cache
def _csv_options() -> Any:
    import pyarrow.csv as pcsv  # type: ignore[import-untyped]

    return pcsv.WriteOptions(include_header=False, quoting_style="needed")


def stage_table(writes: WriteColumns) -> "pa.Table":
    """The staging table's columns of a batch (changes as PostgreSQL array literals)."""
    import pyarrow as pa
    import pyarrow.compute as pc  # type: ignore[import-untyped]

    values = pa.array(writes.change_values, pa.int64()).cast(pa.string())
    lists = pa.ListArray.from_arrays(pa.array(writes.change_offsets, pa.int32()), values)
    changes = pc.binary_join_element_wise("{", pc.binary_join(lists, ","), "}", "")
    table = writes.table
    return pa.table(
        {
            "coll": table["collection"],
            "k": table["key"],
            "r": table["fields"],
            "m": table["member"],
            "pos": table["position"],
            "changes": changes,
            "fresh": pa.array(writes.fresh),
            "deleted": pa.array(writes.deleted),
        }
    )


def csv_bytes(table: "pa.Table") -> bytes:
    """``table`` as CSV for ``COPY ... (FORMAT csv)``: nulls unquoted and empty, strings quoted
    when needed (so an empty string stays one)."""
    import pyarrow as pa
    import pyarrow.csv as pcsv

    sink = pa.BufferOutputStream()
    pcsv.write_csv(table, sink, _csv_options())
    return bytes(sink.getvalue())


def _fields_of(row: dict[str, Any], generic: bool) -> dict[str, Any]:
    """An entry's fields from ``to_jsonb`` of its row."""
    if generic:
        return dict(row.get("fields") or {})
    return {k: v for k, v in row.items() if k not in META_COLUMNS}


def staged_fields(fields: Mapping[str, Any]) -> tuple[str, str | None]:
    """The text to stage for a write's fields and the member holding them (None: all)."""
    if isinstance(fields, JsonObject):
        return fields.text, fields.member
    return fields_json(fields), None


def _key_column(typed: TypedTable, name: str) -> TypedColumn:
    column = typed.column(name)
    if column is None:
        raise StoreError(f"key column {name} of {typed.table} is not among its columns")
    return column


def _columns(conn: psycopg.Connection[Any], schema: str, table: str) -> dict[str, str]:
    rows = conn.execute(
        "SELECT column_name, data_type FROM information_schema.columns"
        " WHERE table_schema = %s AND table_name = %s ORDER BY ordinal_position",
        (schema, table),
    ).fetchall()
    return {str(r[0]): str(r[1]) for r in rows}


def _is_data_error(exc: psycopg.Error) -> bool:
    return (exc.sqlstate or "")[:2] in _DATA_ERRORS


# -- reads and the materializer's transaction ----------------------------------------------


class TableAccess:
    """Reads and derived writes on one generation's tables, inside a transaction
    (the :class:`~tributary.view_store.StoreTxn` of the PostgreSQL store)."""

    def __init__(
        self,
        store: PostgresStore,
        conn: psycopg.Connection[Any],
        shadow: str | None,
        ensure: Any = None,
    ) -> None:
        self.store = store
        self.conn = conn
        self.shadow = shadow
        self._ensure = ensure

    def _tables(self, collection: str) -> tuple[sql.Composed, TypedTable | None]:
        if self._ensure is not None:
            self._ensure(self.conn, collection)
        layout = self.store._layout(collection)
        typed = layout if isinstance(layout, TypedTable) else None
        return self.store._t(self.store.table(collection, self.shadow)), typed

    def table_sql(self, collection: str) -> sql.Composed:
        """The collection's table in this generation (created if absent), for a view's own
        set-based SQL in its materializer."""
        return self._tables(collection)[0]

    def _exists(self, collection: str) -> bool:
        row = self.conn.execute(
            "SELECT to_regclass(%s)",
            (f'"{self.store.schema}"."{self.store.table(collection, self.shadow)}"',),
        ).fetchone()
        return row is not None and row[0] is not None

    def _entries(
        self, collection: str, where: sql.Composable, params: Sequence[Any]
    ) -> list[Entry]:
        if self._ensure is None and not self._exists(collection):
            return []
        t, typed = self._tables(collection)
        if typed is None:
            rows = self.conn.execute(
                sql.SQL("SELECT key, fields, {}, {} FROM {} t WHERE {}").format(
                    sql.Identifier(POSITION), sql.Identifier(APPLIED), t, where
                ),
                params,
            ).fetchall()
            return [Entry(collection, str(k), dict(f), int(p), int(a)) for k, f, p, a in rows]
        rows = self.conn.execute(
            sql.SQL("SELECT to_jsonb(t) FROM {} t WHERE {}").format(t, where), params
        ).fetchall()
        out = []
        for (row,) in rows:
            fields = {k: v for k, v in row.items() if k not in META_COLUMNS}
            key = json.dumps({c: row[c] for c in typed.key}, sort_keys=True, separators=(",", ":"))
            out.append(Entry(collection, key, fields, int(row[POSITION]), int(row[APPLIED])))
        return out

    def _key_where(self, collection: str, key: str) -> tuple[sql.Composable, list[Any]]:
        layout = self.store._layout(collection)
        if not isinstance(layout, TypedTable):
            return sql.SQL("t.key = %s"), [key]
        parts = [
            sql.SQL("t.{} = {}").format(
                sql.Identifier(c), _key_column(layout, c).value_sql(sql.SQL("%s::jsonb"))
            )
            for c in layout.key
        ]
        return sql.SQL(" AND ").join(parts), [key] * len(layout.key)

    def get(self, collection: str, key: str) -> Entry | None:
        where, params = self._key_where(collection, key)
        found = self._entries(collection, where, params)
        return found[0] if found else None

    def scan(self, collection: str) -> list[Entry]:
        return self._entries(collection, sql.SQL("true"), [])

    def count(self, collection: str, field: str, value: Any) -> int:
        return len(self.find(collection, field, value))

    def find(self, collection: str, field: str, value: Any) -> list[Entry]:
        layout = self.store._layout(collection)
        text = _as_text(value)
        if isinstance(layout, TypedTable):
            where = sql.SQL("t.{}::text = %s").format(sql.Identifier(field))
        else:
            where = sql.SQL("t.fields ->> {} = %s").format(sql.Literal(field))
        return self._entries(collection, where, [text])

    def put(self, collection: str, key: str, fields: Mapping[str, Any]) -> None:
        t, typed = self._tables(collection)
        pos, app = sql.Identifier(POSITION), sql.Identifier(APPLIED)
        if typed is None:
            self.conn.execute(
                sql.SQL(
                    "INSERT INTO {} (key, {}, {}, fields) VALUES (%s, 0, 0, %s::jsonb)"
                    " ON CONFLICT (key) DO UPDATE SET fields = EXCLUDED.fields"
                ).format(t, pos, app),
                (key, fields_json(fields)),
            )
            return
        source = sql.SQL("%(r)s::jsonb")
        columns = [c for c in typed.columns if c.name in fields or c.name in typed.key]
        sets = [c for c in columns if c.name not in typed.key]
        self.conn.execute(
            sql.SQL(
                "INSERT INTO {t} ({names}, {pos}, {app}) SELECT {values}, 0, 0"
                " ON CONFLICT ({keys}) DO {action}"
            ).format(
                t=t,
                names=sql.SQL(", ").join(sql.Identifier(c.name) for c in columns),
                pos=pos,
                app=app,
                values=sql.SQL(", ").join(c.value_sql(source) for c in columns),
                keys=sql.SQL(", ").join(map(sql.Identifier, typed.key)),
                action=sql.SQL("UPDATE SET {}").format(
                    sql.SQL(", ").join(
                        sql.SQL("{c} = EXCLUDED.{c}").format(c=sql.Identifier(c.name)) for c in sets
                    )
                )
                if sets
                else sql.SQL("NOTHING"),
            ),
            {"r": fields_json(fields)},
        )

    def delete(self, collection: str, key: str) -> None:
        t, _ = self._tables(collection)
        where, params = self._key_where(collection, key)
        self.conn.execute(sql.SQL("DELETE FROM {} t WHERE {}").format(t, where), params)


def _as_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
