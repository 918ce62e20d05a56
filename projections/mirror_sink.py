"""The mirror's sink: applies a batch of :class:`MirrorWrite` to PostgreSQL in one transaction
together with the batch id, guarded per key by position.

In one transaction: lock the ledger row (skip the whole batch if its id is already recorded),
stage the writes with COPY, delete / update / insert with ``_position < new position`` guards,
record the batch id and offsets, commit. A redelivered batch is skipped by its id; a re-sent
upstream record is dropped by its position; so nothing is applied twice.
"""

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import psycopg
from psycopg import sql

from projections.errors import SinkError, StaleGenerationError
from projections.ledger import Offsets, ViewLedger, merge_offsets
from projections.mirror import MirrorWrite
from projections.mirror_table import APPLIED, POSITION, MirrorTable, TableShape

BatchHook = Callable[[int], None]

_STAGE = sql.Identifier("_tributary_mirror_stage")


class PostgresMirrorSink:
    """Writes one generation of a mirror view into ``table``.

    ``live`` marks the generation readers see: its batches also check that it is still the live
    generation. ``before_commit`` / ``after_commit`` are called with the batch id around the
    commit (crash tests use them to stop the process at exactly that point).
    """

    def __init__(
        self,
        dsn: str,
        view: str,
        generation: str,
        table: MirrorTable,
        *,
        live: bool = True,
        before_commit: BatchHook | None = None,
        after_commit: BatchHook | None = None,
    ) -> None:
        self.dsn = dsn
        self.view = view
        self.generation = generation
        self.table = table
        self.live = live
        self.ledger = ViewLedger(table.schema)
        self._before_commit = before_commit
        self._after_commit = after_commit
        self._conn: psycopg.Connection[Any] | None = None
        self._shape = TableShape(table)

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(self.dsn, autocommit=False)
            with self._conn.transaction():
                self.ledger.ensure(self._conn)
                self._conn.execute(
                    sql.SQL(
                        "CREATE TEMP TABLE IF NOT EXISTS {} (k text, r text, pos bigint,"
                        " applied bigint[], fresh boolean, deleted boolean) ON COMMIT DELETE ROWS"
                    ).format(_STAGE)
                )
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def apply(
        self, batch_id: int, writes: Sequence[MirrorWrite], offsets: Mapping[str, Mapping[str, int]]
    ) -> bool:
        """Apply the batch unless its id is already recorded; True if applied."""
        conn = self._connection()
        try:
            with conn.transaction():
                previous = self.ledger.begin_batch(
                    conn, self.view, self.generation, batch_id, self.live
                )
                if previous is None:
                    return False
                self._shape.load(conn)
                if writes:
                    self._write(conn, writes)
                batch_offsets: Offsets = {t: dict(p) for t, p in offsets.items()}
                self.ledger.record_batch(
                    conn,
                    self.view,
                    self.generation,
                    batch_id,
                    merge_offsets(previous, batch_offsets),
                )
                if self._before_commit is not None:
                    self._before_commit(batch_id)
        except StaleGenerationError:
            raise
        except psycopg.Error as exc:
            self.close()
            raise SinkError(
                f"view {self.view}: batch {batch_id} failed in {self.table.qualified}: {exc}"
                " (the batch is retried when the job restarts)"
            ) from exc
        if self._after_commit is not None:
            self._after_commit(batch_id)
        return True

    def _write(self, conn: psycopg.Connection[Any], writes: Sequence[MirrorWrite]) -> None:
        self._shape.ensure(
            conn, (w.key for w in writes), (w.row for w in writes if w.row is not None)
        )
        if not self._shape.exists:
            return  # only deletes of keys never seen: nothing to remove
        with conn.cursor() as cur:
            with cur.copy(
                sql.SQL("COPY {} (k, r, pos, applied, fresh, deleted) FROM STDIN").format(_STAGE)
            ) as copy:
                for w in writes:
                    copy.write_row(
                        (
                            json.dumps(w.key),
                            None if w.row is None else json.dumps(w.row),
                            w.position,
                            w.applied,
                            w.fresh,
                            w.row is None,
                        )
                    )
            for statement in self._statements():
                cur.execute(statement)

    def _statements(self) -> list[sql.Composed]:
        t, d = self.table.ident, self.table.deleted_ident
        pos, applied = sql.Identifier(POSITION), sql.Identifier(APPLIED)
        key_match = sql.SQL(" AND ").join(
            sql.SQL("m.{c} = p.{c}").format(c=sql.Identifier(c)) for c in self._shape.key
        )
        data = [sql.Identifier(c) for c in self._shape.data_columns]
        non_key = [sql.Identifier(c) for c in self._shape.data_columns if c not in self._shape.key]
        sets = [sql.SQL("{c} = p.{c}").format(c=c) for c in non_key]
        newer = sql.SQL("(SELECT count(*) FROM unnest(s.applied) a WHERE a > {})")
        delete = sql.SQL(
            "DELETE FROM {t} m USING {stage} s,"
            " LATERAL jsonb_populate_record(NULL::{t}, s.k::jsonb) p"
            " WHERE s.deleted AND {key_match} AND m.{pos} < s.pos"
        ).format(t=t, stage=_STAGE, key_match=key_match, pos=pos)
        remember = sql.SQL(
            "INSERT INTO {d} AS x (k, {pos})"
            " SELECT s.k::jsonb, s.pos FROM {stage} s WHERE s.deleted"
            " ON CONFLICT (k) DO UPDATE SET {pos} = EXCLUDED.{pos} WHERE x.{pos} < EXCLUDED.{pos}"
        ).format(d=d, stage=_STAGE, pos=pos)
        update = sql.SQL(
            "UPDATE {t} m SET {sets}{pos} = s.pos, {applied} = CASE"
            " WHEN s.fresh AND s.applied[1] > m.{pos} THEN cardinality(s.applied)::bigint"
            " ELSE m.{applied} + {newer} END"
            " FROM {stage} s CROSS JOIN LATERAL jsonb_populate_record(NULL::{t}, s.r::jsonb) p"
            " WHERE NOT s.deleted AND {key_match} AND m.{pos} < s.pos"
        ).format(
            t=t,
            sets=sql.SQL("").join(sql.SQL("{}, ").format(s) for s in sets),
            pos=pos,
            applied=applied,
            newer=newer.format(sql.SQL("m.{}").format(pos)),
            stage=_STAGE,
            key_match=key_match,
        )
        insert = sql.SQL(
            "INSERT INTO {t} ({cols}, {pos}, {applied})"
            " SELECT {pcols}, s.pos, {newer}"
            " FROM {stage} s CROSS JOIN LATERAL jsonb_populate_record(NULL::{t}, s.r::jsonb) p"
            " LEFT JOIN {d} x ON x.k = s.k::jsonb"
            " WHERE NOT s.deleted AND (x.{pos} IS NULL OR x.{pos} < s.pos)"
            " AND NOT EXISTS (SELECT 1 FROM {t} m WHERE {key_match})"
        ).format(
            t=t,
            d=d,
            cols=sql.SQL(", ").join(data),
            pcols=sql.SQL(", ").join(sql.SQL("p.{}").format(c) for c in data),
            pos=pos,
            applied=applied,
            newer=newer.format(sql.SQL("coalesce(x.{}, -1)").format(pos)),
            stage=_STAGE,
            key_match=key_match,
        )
        return [delete, remember, update, insert]
