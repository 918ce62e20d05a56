"""Forgetting a data subject with the configured database and tables (CLI and HTTP API):
:func:`event_store.forgetting.forget` with ``TRIBUTARY_FORGET_TABLES``'s columns (and, in the
crash tests, ``TRIBUTARY_FORGET_STEP_HOOK``'s function called at each step)."""

from event_store.forgetting import ForgetResult, StepHook, forget, parse_app_tables
from infra.plugins import load_named
from infra.settings import Settings


def step_hook(settings: Settings) -> StepHook | None:
    """The function ``forget_step_hook`` names (tests only), or None."""
    if not settings.forget_step_hook:
        return None
    hook, _ = load_named(
        settings.forget_step_hook, "forget step hook", "TRIBUTARY_FORGET_STEP_HOOK", "step"
    )
    return hook  # type: ignore[no-any-return]


def forget_subject(settings: Settings, subject_type: str, subject_id: str) -> ForgetResult:
    """Destroy the subject's key and append ``SubjectForgotten`` (or say why not)."""
    from connectors.postgres import make_engine

    columns = parse_app_tables(settings.forget_tables).get(subject_type, [])
    engine = make_engine(settings.postgres())
    try:
        return forget(
            engine,
            settings.event_store_schema,
            subject_type,
            subject_id,
            columns,
            step=step_hook(settings),
        )
    finally:
        engine.dispose()


EXIT_CODES = {"forgotten": 0, "already": 0, "unknown": 1, "pending": 2}
