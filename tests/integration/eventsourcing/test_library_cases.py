"""The ``eventsourcing`` library's own abstract test cases, run unmodified against the module.

Each class below only says how to make the module's recorder or factory (what the library's
PostgreSQL test module says for its own recorders); every test method is the library's. The
fixture in ``conftest.py`` gives each test a fresh event store schema and selects the module in
the environment, as the library's test cases expect. Like the library's PostgreSQL tests, the
application recorder also runs the library's optional subscription test, and the recorders
run with ``ORIGINATOR_ID_TYPE=text`` too.
"""

import os
from typing import Any
from uuid import uuid4

from eventsourcing.persistence import (
    AggregateRecorder,
    ApplicationRecorder,
    ProcessRecorder,
    TrackingRecorder,
)
from eventsourcing.tests import application as library_application
from eventsourcing.tests import persistence as library
from eventsourcing.utils import Environment

from event_store.eventsourcing import (
    TributaryAggregateRecorder,
    TributaryApplicationRecorder,
    TributaryFactory,
    TributaryProcessRecorder,
    TributarySnapshotRecorder,
    TributaryTrackingRecorder,
)
from tests.integration.eventsourcing.conftest import environment

FACTORY_TOPIC = "event_store.eventsourcing.factory:TributaryFactory"


class WithFactory:
    """Makes the module's factory from the environment (the test's schema), closes it after."""

    factory: TributaryFactory

    def setUp(self) -> None:
        self.factory = TributaryFactory(Environment("LibraryTests", environment()))
        super().setUp()  # type: ignore[misc]

    def tearDown(self) -> None:
        super().tearDown()  # type: ignore[misc]
        self.factory.close()


class WithTextIds(WithFactory):
    """``ORIGINATOR_ID_TYPE=text``: ids are any strings, given back as strings."""

    def setUp(self) -> None:
        os.environ["ORIGINATOR_ID_TYPE"] = "text"  # the fixture's monkeypatch restores it
        super().setUp()

    def new_originator_id(self) -> str:
        return f"test-{uuid4()}"


class TestAggregateRecorder(WithFactory, library.AggregateRecorderTestCase):
    def create_recorder(self) -> AggregateRecorder:
        return self.factory.aggregate_recorder()


class TestAggregateRecorderWithTextIds(WithTextIds, TestAggregateRecorder):
    pass


class TestSnapshotRecorder(WithFactory, library.AggregateRecorderTestCase):
    """The recorder of ``purpose="snapshots"`` (the module's own table)."""

    def create_recorder(self) -> AggregateRecorder:
        recorder = self.factory.aggregate_recorder("snapshots")
        assert isinstance(recorder, TributarySnapshotRecorder)
        return recorder


class TestApplicationRecorder(WithFactory, library.ApplicationRecorderTestCase[Any]):
    def create_recorder(self) -> ApplicationRecorder:
        return self.factory.application_recorder()

    def test_insert_subscribe(self) -> None:
        self.optional_test_insert_subscribe()


class TestApplicationRecorderWithTextIds(WithTextIds, TestApplicationRecorder):
    pass


class TestNonInterleavingNotificationIds(
    WithFactory, library.NonInterleavingNotificationIDsBaseCase
):
    def create_recorder(self) -> ApplicationRecorder:
        return self.factory.application_recorder()


class TestTrackingRecorder(WithFactory, library.TrackingRecorderTestCase):
    def create_recorder(self) -> TrackingRecorder:
        return self.factory.tracking_recorder()


class TestProcessRecorder(WithFactory, library.ProcessRecorderTestCase):
    def create_recorder(self) -> ProcessRecorder:
        return self.factory.process_recorder()


class CustomTrackingRecorder(TributaryTrackingRecorder):
    """A tracking recorder subclass, as the factory test case asks for."""


class TestInfrastructureFactory(library.InfrastructureFactoryTestCase[TributaryFactory]):
    def setUp(self) -> None:
        self.env = Environment("TestCase", environment())
        super().setUp()

    def expected_factory_class(self) -> type[TributaryFactory]:
        return TributaryFactory

    def expected_aggregate_recorder_class(self) -> type[AggregateRecorder]:
        return TributaryAggregateRecorder

    def expected_application_recorder_class(self) -> type[ApplicationRecorder]:
        return TributaryApplicationRecorder

    def expected_tracking_recorder_class(self) -> type[TrackingRecorder]:
        return TributaryTrackingRecorder

    def tracking_recorder_subclass(self) -> type[TrackingRecorder]:
        return CustomTrackingRecorder

    def expected_process_recorder_class(self) -> type[ProcessRecorder]:
        return TributaryProcessRecorder


class TestApplication(library_application.ApplicationTestCase):
    """The library's application tests; ``Application()`` finds the module in the
    environment."""


class TestExampleApplication(library_application.ExampleApplicationTestCase):
    """The library's bank accounts example (snapshots included) on the module."""

    expected_factory_topic = FACTORY_TOPIC
