"""The change-event model (defined in ``tributary.changes`` so every layer may decode it)."""

from tributary.changes import ChangeDecodeError, ChangeEvent, Op, SourcePosition

__all__ = ["ChangeDecodeError", "ChangeEvent", "Op", "SourcePosition"]
