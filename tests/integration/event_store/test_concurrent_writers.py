"""16 concurrent writers on 50 aggregates through the command bus."""

import random
import threading
from collections import Counter, defaultdict

from sqlalchemy import text

from event_store import Accepted, ConcurrencyError
from examples.social import CreatePost, EditPost
from tests.integration.event_store.conftest import StoreEnv

WRITERS = 16
AGGREGATES = 50
COMMANDS_PER_WRITER = 25


def test_every_accepted_command_is_stored_once_with_gapless_versions(env: StoreEnv) -> None:
    setup = env.bus()
    for post_id in range(AGGREGATES):
        assert isinstance(setup.send(CreatePost(post_id, 1, f"post {post_id}")), Accepted)

    accepted: list[Accepted] = []
    conflicts: list[ConcurrencyError] = []
    failures: list[BaseException] = []
    attempts: list[int] = []
    lock = threading.Lock()
    barrier = threading.Barrier(WRITERS)

    def writer(seed: int) -> None:
        bus = env.bus(max_retries=2)
        rng = random.Random(seed)
        barrier.wait()
        for i in range(COMMANDS_PER_WRITER):
            command = EditPost(rng.randrange(AGGREGATES), f"edit {seed}/{i} #w{seed}")
            try:
                result = bus.send(command)
            except ConcurrencyError as exc:
                with lock:
                    conflicts.append(exc)
                continue
            except BaseException as exc:
                with lock:
                    failures.append(exc)
                return
            with lock:
                assert isinstance(result, Accepted), result
                accepted.append(result)
        with lock:
            attempts.append(bus.attempts)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(WRITERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures
    assert len(accepted) + len(conflicts) == WRITERS * COMMANDS_PER_WRITER
    # Losers either retried to success (more attempts than outcomes) or saw ConcurrencyError.
    assert sum(attempts) > len(accepted) or conflicts, "no writer ever lost a race"

    with env.admin.connect() as conn:
        rows = conn.execute(
            text(
                f"SELECT stream_id, version, event_id::text, metadata->>'command_id' "
                f"FROM {env.schema}.events WHERE event_type = 'PostEdited'"
            )
        ).all()
        all_versions = conn.execute(
            text(
                f"SELECT stream_id, array_agg(version ORDER BY version) FROM {env.schema}.events "
                "GROUP BY stream_id"
            )
        ).all()
    stored_ids = Counter(r[2] for r in rows)
    assert all(n == 1 for n in stored_ids.values())
    accepted_ids = [eid for result in accepted for eid in result.event_ids]
    assert sorted(accepted_ids) == sorted(stored_ids), "stored events != accepted commands' events"
    assert {r[3] for r in rows} == {result.command_id for result in accepted}

    for stream_id, versions in all_versions:
        assert versions == list(range(1, len(versions) + 1)), f"{stream_id} has gaps: {versions}"
    per_stream: dict[str, int] = defaultdict(int)
    for result in accepted:
        per_stream[result.stream_id] += 1
    assert sum(len(v) for _, v in all_versions) == AGGREGATES + len(accepted)
    for stream_id, versions in all_versions:
        assert len(versions) == 1 + per_stream[stream_id]
