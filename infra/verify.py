"""`tributary verify` and `tributary repair`: the source of truth against the topics and views.

verify:
- each captured table against its CDC topic (rows missing, stale or extra on the topic);
- the event store against the ``events.<type>`` topics (events missing, re-delivered,
  unknown);
- each view against what the source of truth says it must hold (the view's own check, e.g.
  the mirror against its table, the profile cache against the users and the event store),
  and how far it is behind its topics.

repair: re-publishes missing events from the event store, asks CDC for an incremental
snapshot of missing or stale rows and publishes deletes of extra keys; the views converge as
their jobs run (positions make re-sent records harmless). Run it after a broker crash.
`tributary run` runs verify periodically and `tributary status` shows the last result.

Each run reads only what the topics gained since the last one: checkpoints in
``<home>/verify`` (:mod:`cdc.checked`) keep what was read; ``full`` reads every topic whole.
"""

import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

# The checks' modules (drivers, the views' definitions) are imported where verify and repair
# run: `tributary status` reads the last result (:func:`read_last`) and starts fast.
if TYPE_CHECKING:
    from cdc.completeness import EventsReport, TableReport
    from infra.settings import Settings


@dataclass
class VerifyReport:
    """What verify found; ``ok`` when nothing is missing, stale or wrong."""

    tables: "list[TableReport]" = field(default_factory=list)
    events: "EventsReport | None" = None
    views: dict[str, list[str]] = field(default_factory=dict)
    lag: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    at: float = field(default_factory=time.time)

    @property
    def ok(self) -> bool:
        return (
            all(t.ok for t in self.tables)
            and (self.events is None or self.events.ok)
            and not any(self.views.values())
            and not self.errors
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "at": self.at,
            "tables": [t.as_dict() for t in self.tables],
            "events": None if self.events is None else self.events.as_dict(),
            "views": {
                name: {"differences": d, "lag": self.lag.get(name)}
                for name, d in self.views.items()
            },
            "errors": self.errors,
        }


def captured_tables(s: "Settings") -> list[str]:
    """The tables CDC mirrors raw into ``<prefix>.<schema>.<table>`` (not the outbox)."""
    return [t for t in s.cdc_tables if t != s.cdc_outbox_table]


def verify(s: "Settings", *, views: bool = True, full: bool = False) -> VerifyReport:
    """Compare the source of truth with the topics (and, with ``views``, with each view).
    The topics are read since the last verify's checkpoints; with ``full``, whole."""
    from cdc.checked import CheckedTopics
    from cdc.completeness import compare_events, compare_table
    from infra.views import views_config
    from views.catalog import configured_views
    from views.status import view_statuses

    report = VerifyReport()
    db, kafka = s.postgres(), s.kafka("tributary-verify")
    checked = CheckedTopics(s.verify_state_dir)
    for table in captured_tables(s):
        topic = f"{s.cdc_topic_prefix}.{table}"
        try:
            report.tables.append(compare_table(db, kafka, table, topic, checked, full))
        except Exception as exc:  # one unreadable part must not hide the others
            report.errors.append(f"{table}: {type(exc).__name__}: {exc}")
    if s.cdc_outbox_table:
        try:
            report.events = compare_events(
                db, kafka, s.event_store_schema, s.event_topic_prefix, checked, full
            )
        except Exception as exc:
            report.errors.append(f"event store: {type(exc).__name__}: {exc}")
    if views:
        configured = list(configured_views(views_config(s)).values())
        try:
            report.lag = {st.view: st.lag for st in view_statuses(configured, kafka)}
        except Exception as exc:
            report.errors.append(f"view status: {type(exc).__name__}: {exc}")
        for view in configured:
            if view.verify is None:
                continue
            try:
                report.views[view.name] = view.verify()
            except Exception as exc:
                report.views[view.name] = [f"cannot check: {type(exc).__name__}: {exc}"]
    return report


def repair(s: "Settings", report: VerifyReport | None = None) -> dict[str, Any]:
    """Repair what a verify found (one is run first when none is given)."""
    from cdc.completeness import repair_table, republish_events

    report = report or verify(s, views=False)
    db, kafka = s.postgres(), s.kafka("tributary-repair")
    done: dict[str, Any] = {"tables": {}, "events_republished": 0}
    for table in report.tables:
        if not table.ok:
            done["tables"][table.table] = repair_table(db, kafka, table)
    if report.events is not None and report.events.missing:
        done["events_republished"] = republish_events(
            db,
            kafka,
            s.event_store_schema,
            report.events.missing,
            s.event_topic_prefix,
            s.registry_url,
        )
    return done


class VerifyLoop(threading.Thread):
    """Runs verify every ``interval_s`` and keeps the last result in ``<home>/run/verify.json``
    (what `tributary status` shows)."""

    def __init__(self, s: "Settings", interval_s: float, stop: threading.Event) -> None:
        super().__init__(name="verify", daemon=True)
        self.settings = s
        self.interval_s = interval_s
        self.halt = stop

    def run(self) -> None:
        while not self.halt.wait(self.interval_s):
            try:
                result = verify(self.settings).as_dict()
            except Exception as exc:
                result = {
                    "ok": False,
                    "at": time.time(),
                    "errors": [f"{type(exc).__name__}: {exc}"],
                }
            write_last(self.settings, result)


def last_path(s: "Settings") -> Path:
    return s.home / "run" / "verify.json"


def write_last(s: "Settings", result: dict[str, Any]) -> None:
    path = last_path(s)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result))
    tmp.replace(path)


def read_last(s: "Settings") -> dict[str, Any] | None:
    try:
        loaded: dict[str, Any] = json.loads(last_path(s).read_text())
        return loaded
    except (OSError, ValueError):
        return None
