"""A deferred stateful processor: what Spark's driver unpickles at each query start imports
nothing of the processor's module, and it declares the processor's state variables."""

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pyspark import cloudpickle

from examples.social.analytics import alerts, ctr, likes, sessions
from spark_streaming.deferred_processor import DeferredProcessor
from spark_streaming.errors import StreamingError

ROOT = Path(__file__).resolve().parents[3]

HEAVY = ("pandas", "pyarrow", "numpy", "psycopg")


def analytics_processors() -> list[DeferredProcessor]:
    return [
        DeferredProcessor.of(ctr._processor, 300_000, "ctr"),
        DeferredProcessor.of(ctr._totals_processor),
        DeferredProcessor.of(likes._processor, 300_000, "likes"),
        DeferredProcessor.of(likes._join_processor, 300_000),
        DeferredProcessor.of(sessions._processor, 1_800_000, "sessions"),
        DeferredProcessor.of(alerts._processor, "alerts"),
    ]


def test_unpickled_on_the_driver_they_import_none_of_their_modules(tmp_path: Path) -> None:
    pickled = tmp_path / "processors.pkl"
    pickled.write_bytes(cloudpickle.dumps(analytics_processors()))  # type: ignore[no-untyped-call]
    loaded = subprocess.run(
        [
            sys.executable,
            "-c",
            "import pickle, sys; ps = pickle.load(open(sys.argv[1], 'rb'));"
            " print(len(ps), sorted(m for m in sys.modules if m.split('.')[0] in"
            f" {HEAVY!r} or m.startswith('examples.social.analytics.')))",
            str(pickled),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.split() == ["6", "[]"]


def test_they_declare_what_their_processors_init_declares() -> None:
    by_factory = {p.factory: p.declarations for p in analytics_processors()}
    assert by_factory["examples.social.analytics.ctr:_processor"] == [
        ("getValueState", ("ctr", ctr.STATE_SCHEMA), ())
    ]
    assert [d[:2] for d in by_factory["examples.social.analytics.alerts:_processor"]] == [
        ("getListState", ("posts", "t long, post_id long")),
        ("getValueState", ("cursor", "t long, post_id long")),
        ("getMapState", ("open", "alert_id string", "start long, posts long")),
        ("getMapState", ("follows", "followee long", "t long")),
        ("getValueState", ("revision", "revision long")),
    ]


def _nested() -> Any:
    def factory() -> Any:
        return None

    return factory


def _reads_state_in_init() -> Any:
    class Reads:
        def init(self, handle: Any) -> None:
            handle.getValueState("v", "n long")
            handle.listTimers()

    return Reads()


def test_a_nested_factory_or_an_init_that_does_more_than_declare_is_refused() -> None:
    with pytest.raises(StreamingError, match="not a module-level function"):
        DeferredProcessor.of(_nested())
    with pytest.raises(StreamingError, match=r"its init calls handle\.listTimers"):
        DeferredProcessor.of(_reads_state_in_init)
