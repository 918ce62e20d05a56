"""The change-event model (defined in ``connectors.changes`` so every layer may decode it)."""

from connectors.changes import ChangeDecodeError, ChangeEvent, Op, SourcePosition

__all__ = ["ChangeDecodeError", "ChangeEvent", "Op", "SourcePosition"]
