"""read_all under concurrent appends: every committed event exactly once, streams in order."""

import random
import threading
import time
from collections import defaultdict

from sqlalchemy import text

from event_store import ConcurrencyError, NewEvent, Position, RecordedEvent
from tests.integration.event_store.conftest import StoreEnv

WRITERS = 4
APPENDS_PER_WRITER = 60
STREAMS = 10
SLOW_APPENDS = 4


def _writer(env: StoreEnv, seed: int, errors: list[BaseException]) -> None:
    rng = random.Random(seed)
    try:
        for _ in range(APPENDS_PER_WRITER):
            stream = f"s-{rng.randrange(STREAMS)}"
            while True:
                version = env.store.stream_version(stream)
                batch = [NewEvent("Tick", {"w": seed}) for _ in range(rng.randint(1, 3))]
                try:
                    env.store.append(stream, batch, version, stream_type="tick")
                    break
                except ConcurrencyError:
                    continue
    except BaseException as exc:  # reported by the test
        errors.append(exc)


def _slow_writer(env: StoreEnv, overtaken: list[int], errors: list[BaseException]) -> None:
    """Takes its positions early and commits late, while others commit higher positions."""
    try:
        for i in range(SLOW_APPENDS):
            with env.app.begin() as conn:
                result = env.store.append(
                    f"slow-{i}",
                    [NewEvent("Slow", {"i": i})],
                    0,
                    stream_type="tick",
                    connection=conn,
                )
                time.sleep(0.4)
                with env.app.connect() as other:
                    committed = other.execute(
                        text(f"SELECT max(position) FROM {env.schema}.events")
                    ).scalar_one()
                assert result.position is not None
                if committed > result.position.sequence:
                    overtaken.append(i)  # a higher position committed before ours
    except BaseException as exc:
        errors.append(exc)


def test_read_all_never_skips_and_keeps_stream_order(env: StoreEnv) -> None:
    errors: list[BaseException] = []
    overtaken: list[int] = []
    threads = [threading.Thread(target=_writer, args=(env, i, errors)) for i in range(WRITERS)]
    threads.append(threading.Thread(target=_slow_writer, args=(env, overtaken, errors)))
    for t in threads:
        t.start()

    seen: list[RecordedEvent] = []
    after: Position | None = None
    while any(t.is_alive() for t in threads):
        page = env.store.read_all(after, limit=25)
        seen.extend(page)
        if page:
            after = page[-1].position
        else:
            time.sleep(0.005)
    for t in threads:
        t.join()
    assert not errors, errors
    # Drain. Another session's open write transaction (tests share the cluster) may hold
    # the horizon back for a while: wait for it, never skip past it.
    total = env.count_events()
    deadline = time.monotonic() + 60
    while len(seen) < total and time.monotonic() < deadline:
        page = env.store.read_all(after, limit=25)
        seen.extend(page)
        if page:
            after = page[-1].position
        else:
            time.sleep(0.05)

    with env.admin.connect() as conn:
        stored = {
            str(r[0]) for r in conn.execute(text(f"SELECT event_id FROM {env.schema}.events"))
        }
    ids = [str(e.event_id) for e in seen]
    assert len(ids) == len(set(ids)), "an event was returned twice"
    assert set(ids) == stored, f"{len(stored - set(ids))} committed events were skipped"
    assert len(stored) >= WRITERS * APPENDS_PER_WRITER + SLOW_APPENDS

    versions: dict[str, list[int]] = defaultdict(list)
    for event in seen:
        versions[event.stream_id].append(event.version)
    for stream, vs in versions.items():
        assert vs == list(range(1, len(vs) + 1)), f"{stream} out of order: {vs}"

    # The hazard really happened: higher positions committed while a lower one was pending.
    assert overtaken, "the slow writer was never overtaken: the test proved nothing"
    assert [e.position for e in seen] == sorted(e.position for e in seen)
