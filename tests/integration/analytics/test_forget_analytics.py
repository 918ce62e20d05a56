"""A forgotten user leaves the analytics outputs (issue 23), on real Spark, Kafka and PostgreSQL.

The jobs whose outputs name users (activity, sessions, CTR, alerts) fold the generated
workload, then read the ``SubjectForgotten`` of its busiest user from ``events.subject``: the
one micro-batch that carries it deletes every output entry naming the user (as user, follower
or followee; in PostgreSQL and on the ``analytics.*`` topics downstream teams
read), and leaves every other entry as it was. Each job's `tributary verify` check is clean
then, and names a row that names the user again behind the job's back. A replay from offset
zero (the user's records and the forget in one batch) holds nothing of the user either.
"""

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from connectors.stores.postgres import PostgresStore
from examples.social.analytics import AnalyticsConfig, alerts, corrected, ctr, sessions
from examples.social.analytics.stateful import FORGOTTEN
from spark_streaming.replay import SwapRefusedError
from tests.integration.analytics.feed import T0, AnalyticsFeed, Workload, make_workload
from tests.integration.analytics.lab import (
    held,
    kafka_held,
    lab_config,
    replay_jobs,
    run_jobs,
    views_by_job,
)
from tests.integration.conftest import Endpoints
from views.catalog import JobOptions

#: The jobs whose outputs name users, and the fields that do (collection -> fields).
HOLDERS: dict[str, Mapping[str, Sequence[str]]] = {
    "activity": corrected.HOLDERS,
    "sessions": sessions.HOLDERS,
    "ctr": ctr.HOLDERS,
    "alerts": alerts.HOLDERS,
}
ONE_BATCH = 1_000_000  # maxOffsetsPerTrigger: the workload in one micro-batch


def naming(entries: dict[str, dict[str, Any]], fields: Sequence[str], user: int) -> set[str]:
    """The keys of the entries that name ``user`` in one of ``fields``."""
    return {key for key, f in entries.items() if user in {f.get(name) for name in fields}}


@pytest.fixture
def lab(stack: Endpoints, unique: str) -> Iterator[tuple[AnalyticsConfig, Workload]]:
    config = lab_config(stack.kafka, stack.postgres_dsn, unique, stack.settings.registry_url)
    work = make_workload(config.lateness)
    AnalyticsFeed(config).write(work)
    yield config, work
    with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(config.schema))
        )


@pytest.mark.timeout(300)
def test_a_forgotten_user_leaves_every_analytics_output_within_one_batch(
    spark: Any, lab: tuple[AnalyticsConfig, Workload], stack: Endpoints, tmp_path: Path
) -> None:
    config, _ = lab
    views = views_by_job(config)
    jobs = [views[name] for name in HOLDERS]
    options = JobOptions(
        checkpoint_root=tmp_path / "checkpoints", max_offsets_per_trigger=ONE_BATCH
    )
    run_jobs(spark, jobs, config.kafka, options)
    before = {name: held(views[name]) for name in HOLDERS}
    downstream_before = {name: kafka_held(views[name]) for name in HOLDERS}

    def named(user: int) -> dict[str, int]:
        return {
            f"{name}.{collection}": len(naming(before[name][collection], fields, user))
            for name, holders in HOLDERS.items()
            for collection, fields in holders.items()
        }

    users = {f.get("user_id") for f in before["sessions"]["sessions"].values()}
    user = max(sorted(u for u in users if u is not None), key=lambda u: sum(named(u).values()))
    assert all(named(user).values()), named(user)  # every output names the user before
    assert all(views[name].verify() == [] for name in HOLDERS)  # nobody forgotten yet

    AnalyticsFeed(config).write_forgotten(user, T0 + 3 * 3_600_000)
    runs = run_jobs(spark, jobs, config.kafka, options)
    for name in HOLDERS:
        carrying = [r for r in runs[views[name].name].reports if r.records]
        assert len(carrying) == 1, (name, carrying)  # the forget came in one micro-batch
        after = held(views[name])
        expected = {
            collection: (
                {k: f for k, f in entries.items() if k not in naming(entries, fields, user)}
                if (fields := HOLDERS[name].get(collection)) is not None
                else entries
            )
            for collection, entries in before[name].items()
        }
        expected[FORGOTTEN] = {str(user): {"subject_type": "user", "user_id": user}}
        assert after == expected, name  # the user's entries gone, every other one as it was
        downstream = kafka_held(views[name])
        for collection, fields in HOLDERS[name].items():
            was = downstream_before[name][collection]
            assert naming(was, fields, user), (name, collection)  # downstream had the user
            gone = {k: f for k, f in was.items() if k not in naming(was, fields, user)}
            assert downstream[collection] == gone, (name, collection)
        assert views[name].verify() == [], name

    # A replay from offset zero: the user's records and the forget in one batch, none kept.
    live = {name: held(views[name]) for name in HOLDERS}
    try:
        replayed = replay_jobs(spark, jobs, config.kafka, options)
    except SwapRefusedError as exc:  # name what differs
        raise AssertionError(
            [
                (c.kind, d.collection, d.key, d.live, d.shadow)
                for c in exc.result.comparisons
                for d in c.differences
            ]
        ) from exc
    assert all(r.compared and r.identical for r in replayed.values()), replayed
    assert {name: held(views[name]) for name in HOLDERS} == live

    # `verify` names an entry that names the forgotten user again (written behind the job).
    store = views["sessions"].store
    assert isinstance(store, PostgresStore)
    table = sql.Identifier(config.schema, store.table("sessions", None))
    with psycopg.connect(config.dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("UPDATE {} SET user_id = %s WHERE ctid = (SELECT ctid FROM {} LIMIT 1)").format(
                table, table
            ),
            (user,),
        )
    found = views["sessions"].verify()
    assert len(found) == 1 and f"forgotten user {user}: sessions" in found[0], found
