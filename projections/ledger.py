"""The view ledger in PostgreSQL: which generation of each view is live, and per generation the
last applied batch id and the offsets it reached.

A *generation* is one build of a view: its own checkpoint and its own target table. Replay builds
a new generation beside the live one and swaps it in; the ledger row of the view says which
generation is live, so a job still running the old one stops at its next batch
(:class:`~projections.errors.StaleGenerationError`) instead of writing into the new table.
"""

import json
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from projections.errors import StaleGenerationError

Offsets = dict[str, dict[str, int]]

_SCHEMA_LOCK = 0x7472_6962  # advisory lock id: concurrent first runs create the schema once


@dataclass(frozen=True)
class ViewPosition:
    """Where a view generation stands: last batch id and next offsets per topic/partition."""

    view: str
    generation: str
    batch_id: int
    offsets: Offsets


class ViewLedger:
    """Ledger tables ``<schema>._view_generations`` and ``<schema>._view_batches``."""

    def __init__(self, schema: str) -> None:
        self.schema = schema

    def _t(self, name: str) -> sql.Composed:
        return sql.SQL("{}.{}").format(sql.Identifier(self.schema), sql.Identifier(name))

    def ensure(self, conn: psycopg.Connection[Any]) -> None:
        """Create the views schema and the ledger tables if absent (in the caller's transaction)."""
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
        conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(self.schema)))
        conn.execute(
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} (view text PRIMARY KEY, generation text NOT NULL,"
                " swapped_at timestamptz NOT NULL DEFAULT now())"
            ).format(self._t("_view_generations"))
        )
        conn.execute(
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} (view text NOT NULL, generation text NOT NULL,"
                " batch_id bigint NOT NULL, offsets jsonb NOT NULL DEFAULT '{{}}',"
                " updated_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (view, generation))"
            ).format(self._t("_view_batches"))
        )

    def live_generation(self, conn: psycopg.Connection[Any], view: str) -> str | None:
        row = conn.execute(
            sql.SQL("SELECT generation FROM {} WHERE view = %s").format(
                self._t("_view_generations")
            ),
            (view,),
        ).fetchone()
        return None if row is None else str(row[0])

    def claim(self, conn: psycopg.Connection[Any], view: str, generation: str) -> str:
        """Make ``generation`` live if the view has none yet; returns the live generation."""
        conn.execute(
            sql.SQL(
                "INSERT INTO {} (view, generation) VALUES (%s, %s) ON CONFLICT (view) DO NOTHING"
            ).format(self._t("_view_generations")),
            (view, generation),
        )
        live = self.live_generation(conn, view)
        assert live is not None
        return live

    def begin_batch(
        self,
        conn: psycopg.Connection[Any],
        view: str,
        generation: str,
        batch_id: int,
        live: bool,
    ) -> Offsets | None:
        """Lock this generation's ledger row; None when ``batch_id`` is already applied.

        For the live generation, also hold the view's row (shared) so a swap waits for this
        batch, and raise :class:`StaleGenerationError` if another generation went live.
        """
        if live:
            row = conn.execute(
                sql.SQL("SELECT generation FROM {} WHERE view = %s FOR SHARE").format(
                    self._t("_view_generations")
                ),
                (view,),
            ).fetchone()
            if row is None or row[0] != generation:
                raise StaleGenerationError(
                    f"view {view} was rebuilt (live generation {row[0] if row else None}, this job"
                    f" runs {generation}); restart the job to continue from the new generation"
                )
        conn.execute(
            sql.SQL(
                "INSERT INTO {} (view, generation, batch_id) VALUES (%s, %s, -1)"
                " ON CONFLICT (view, generation) DO NOTHING"
            ).format(self._t("_view_batches")),
            (view, generation),
        )
        last = conn.execute(
            sql.SQL(
                "SELECT batch_id, offsets FROM {} WHERE view = %s AND generation = %s FOR UPDATE"
            ).format(self._t("_view_batches")),
            (view, generation),
        ).fetchone()
        assert last is not None
        if int(last[0]) >= batch_id:
            return None
        offsets: Offsets = last[1] or {}
        return offsets

    def record_batch(
        self,
        conn: psycopg.Connection[Any],
        view: str,
        generation: str,
        batch_id: int,
        offsets: Offsets,
    ) -> None:
        conn.execute(
            sql.SQL(
                "UPDATE {} SET batch_id = %s, offsets = %s::jsonb, updated_at = now()"
                " WHERE view = %s AND generation = %s"
            ).format(self._t("_view_batches")),
            (batch_id, json.dumps(offsets), view, generation),
        )

    def make_live(self, conn: psycopg.Connection[Any], view: str, generation: str) -> str | None:
        """Swap step: lock the view's row (waits for a running batch), set the live generation.

        Returns the generation that was live before.
        """
        row = conn.execute(
            sql.SQL("SELECT generation FROM {} WHERE view = %s FOR UPDATE").format(
                self._t("_view_generations")
            ),
            (view,),
        ).fetchone()
        conn.execute(
            sql.SQL(
                "INSERT INTO {} (view, generation) VALUES (%s, %s) ON CONFLICT (view)"
                " DO UPDATE SET generation = EXCLUDED.generation, swapped_at = now()"
            ).format(self._t("_view_generations")),
            (view, generation),
        )
        return None if row is None else str(row[0])

    def register(self, conn: psycopg.Connection[Any], view: str, generation: str) -> None:
        """Record a generation being built (no batch applied yet)."""
        conn.execute(
            sql.SQL(
                "INSERT INTO {} (view, generation, batch_id) VALUES (%s, %s, -1)"
                " ON CONFLICT (view, generation) DO NOTHING"
            ).format(self._t("_view_batches")),
            (view, generation),
        )

    def generations(self, conn: psycopg.Connection[Any], view: str) -> set[str]:
        """Generations of a view still in use: the live one and any being built."""
        rows = conn.execute(
            sql.SQL(
                "SELECT generation FROM {} WHERE view = %s UNION SELECT generation FROM {}"
                " WHERE view = %s"
            ).format(self._t("_view_batches"), self._t("_view_generations")),
            (view, view),
        ).fetchall()
        return {str(r[0]) for r in rows}

    def forget(self, conn: psycopg.Connection[Any], view: str, generation: str) -> None:
        conn.execute(
            sql.SQL("DELETE FROM {} WHERE view = %s AND generation = %s").format(
                self._t("_view_batches")
            ),
            (view, generation),
        )

    def positions(self, conn: psycopg.Connection[Any]) -> list[ViewPosition]:
        """The live generation's position of every view."""
        rows = conn.execute(
            sql.SQL(
                "SELECT g.view, g.generation, coalesce(b.batch_id, -1), coalesce(b.offsets, '{{}}')"
                " FROM {} g LEFT JOIN {} b USING (view, generation) ORDER BY g.view"
            ).format(self._t("_view_generations"), self._t("_view_batches"))
        ).fetchall()
        return [ViewPosition(str(r[0]), str(r[1]), int(r[2]), dict(r[3])) for r in rows]


def merge_offsets(previous: Offsets, batch: Offsets) -> Offsets:
    """Next offsets after a batch: the batch's per partition, the previous ones elsewhere."""
    merged = {topic: dict(parts) for topic, parts in previous.items()}
    for topic, parts in batch.items():
        target = merged.setdefault(topic, {})
        for partition, offset in parts.items():
            target[partition] = max(target.get(partition, 0), offset)
    return merged
