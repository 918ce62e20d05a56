"""Forgetting a data subject with the configured database and tables (CLI and HTTP API):
:func:`event_store.forgetting.forget` with ``TRIBUTARY_FORGET_TABLES``'s columns."""

from event_store.forgetting import ForgetResult, forget, parse_app_tables
from infra.settings import Settings


def forget_subject(settings: Settings, subject_type: str, subject_id: str) -> ForgetResult:
    """Destroy the subject's key and append ``SubjectForgotten`` (or say why not)."""
    from connectors.postgres import make_engine

    columns = parse_app_tables(settings.forget_tables).get(subject_type, [])
    engine = make_engine(settings.postgres())
    try:
        return forget(engine, settings.event_store_schema, subject_type, subject_id, columns)
    finally:
        engine.dispose()


EXIT_CODES = {"forgotten": 0, "already": 0, "unknown": 1, "pending": 2}
