"""The asyncio path: same store, same guarantees, from coroutines."""

import asyncio

from connectors.postgres import PostgresConfig
from event_store import ConcurrencyError, NewEvent, Position, RecordedEvent
from event_store.aio import AsyncEventStore
from tests.integration.conftest import Endpoints
from tests.integration.event_store.conftest import StoreEnv, role_url


def test_async_appends_race_reads_and_agree_with_the_sync_store(
    stack: Endpoints, env: StoreEnv
) -> None:
    config = PostgresConfig(role_url(stack.database_url, env.role), pool_size=8)

    async def scenario() -> tuple[list[object], list[RecordedEvent], list[RecordedEvent]]:
        async with AsyncEventStore(config, env.schema) as store:
            await store.append("a-1", [NewEvent("Opened", {"n": 0})], 0, stream_type="acct")
            racers = [
                store.append("a-1", [NewEvent("Credited", {"n": i})], 1, stream_type="acct")
                for i in range(8)
            ]
            outcomes = await asyncio.gather(*racers, return_exceptions=True)
            batch = [NewEvent("Tick", {"n": i}) for i in range(50)]
            await store.append("a-2", batch, 0, stream_type="acct")
            everything: list[RecordedEvent] = []
            after: Position | None = None
            while page := await store.read_all(after, limit=7):
                everything.extend(page)
                after = page[-1].position
            return list(outcomes), everything, await store.read_stream("a-1")

    outcomes, everything, stream = asyncio.run(scenario())
    winners = [o for o in outcomes if not isinstance(o, BaseException)]
    losers = [o for o in outcomes if isinstance(o, BaseException)]
    assert len(winners) == 1 and len(losers) == 7
    assert all(isinstance(o, ConcurrencyError) for o in losers)
    assert [e.version for e in stream] == [1, 2]
    assert len(everything) == 52
    assert everything == env.store.read_all(limit=1000)
