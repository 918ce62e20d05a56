"""A stateful processor that Spark's driver can set up without importing the processor's module.

When a ``transformWithStateInPandas`` query starts, Spark runs its processor's ``init`` once on
the driver, to learn the state variables, in a fresh Python process. That process unpickles
the processor first, which imports the module the processor is defined in and everything that
module imports: for the analytics jobs pandas, pyarrow, numpy and psycopg, about 1.1 CPU-s per
stateful operator at every start and restart of a query, for an ``init`` that only declares a
few state variables.

:class:`DeferredProcessor` stands in for the processor. It is built on the driver from the
processor's factory, named as ``"module:function"`` with its arguments, and it records the
state variables the processor's ``init`` declares there. Unpickled, it imports nothing of the
processor's module. Its ``init`` declares the recorded variables itself. The processor is
built the first time it has work (rows, an expired timer, an initial state: on the
executors), and its ``init`` gets the variables already declared.
"""

import importlib
from collections.abc import Callable, Iterator
from typing import Any

from pyspark.sql.streaming.stateful_processor import StatefulProcessor

from spark_streaming.errors import StreamingError

__all__ = ["DeferredProcessor"]

#: The handle's methods that declare a state variable (the only ones an ``init`` may call).
DECLARING = ("getValueState", "getListState", "getMapState")

Declaration = tuple[str, tuple[Any, ...], tuple[tuple[str, Any], ...]]


def _build(factory: str, args: tuple[Any, ...]) -> Any:
    module, _, name = factory.partition(":")
    if not module or not name:
        raise StreamingError(f"processor factory {factory!r}: expected 'module:function'")
    return getattr(importlib.import_module(module), name)(*args)


class _Recorder:
    """A handle that records the state variables declared on it (and answers None)."""

    def __init__(self, factory: str) -> None:
        self.factory = factory
        self.declarations: list[Declaration] = []

    def __getattr__(self, name: str) -> Any:
        if name not in DECLARING:
            raise StreamingError(
                f"processor of {self.factory}: its init calls handle.{name}; a deferred"
                f" processor's init may only declare state variables ({', '.join(DECLARING)})"
            )

        def declare(*args: Any, **kwargs: Any) -> None:
            self.declarations.append((name, args, tuple(sorted(kwargs.items()))))

        return declare


class _Declared:
    """The real handle, whose declarations answer with the variables declared already (each
    once, in order); anything else (timers, the watermark) goes to the handle."""

    def __init__(self, handle: Any, declared: list[tuple[Declaration, Any]]) -> None:
        self._handle = handle
        self._declared = list(declared)

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._handle, name)
        if name not in DECLARING:
            return attribute

        def declare(*args: Any, **kwargs: Any) -> Any:
            wanted = (name, args, tuple(sorted(kwargs.items())))
            for i, (declaration, variable) in enumerate(self._declared):
                if declaration == wanted:
                    del self._declared[i]
                    return variable
            return attribute(*args, **kwargs)  # not seen on the driver: declared now

        return declare


class DeferredProcessor(StatefulProcessor):
    """The processor ``factory(*args)`` (``factory``: ``"module:function"``), built where it
    has work; see the module's docstring."""

    def __init__(self, factory: str, *args: Any) -> None:
        self.factory = factory
        self.args = args
        recorder = _Recorder(factory)
        _build(factory, args).init(recorder)
        self.declarations = recorder.declarations
        self._handle: Any = None
        self._variables: list[tuple[Declaration, Any]] = []
        self._processor: Any = None

    @classmethod
    def of(cls, factory: Callable[..., Any], *args: Any) -> "DeferredProcessor":
        """The processor ``factory(*args)``, deferred: ``factory`` is a module's function (its
        name is kept, not the function: unpickling a function imports its module)."""
        if "<" in factory.__qualname__ or "." in factory.__qualname__:
            raise StreamingError(f"{factory.__qualname__}: not a module-level function")
        return cls(f"{factory.__module__}:{factory.__qualname__}", *args)

    def init(self, handle: Any) -> None:
        self._handle = handle
        self._variables = [
            (d, getattr(handle, d[0])(*d[1], **dict(d[2]))) for d in self.declarations
        ]
        self._processor = None

    def _built(self) -> Any:
        if self._processor is None:
            processor = _build(self.factory, self.args)
            processor.init(_Declared(self._handle, self._variables))
            self._processor = processor
        return self._processor

    def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Iterator[Any]:
        result: Iterator[Any] = self._built().handleInputRows(key, rows, timerValues)
        return result

    def handleExpiredTimer(
        self, key: Any, timerValues: Any, expiredTimerInfo: Any
    ) -> Iterator[Any]:
        result: Iterator[Any] = self._built().handleExpiredTimer(key, timerValues, expiredTimerInfo)
        return result

    def handleInitialState(self, key: Any, initialState: Any, timerValues: Any) -> None:
        self._built().handleInitialState(key, initialState, timerValues)

    def close(self) -> None:
        if self._processor is not None:
            self._processor.close()
            self._processor = None

    def __getstate__(self) -> dict[str, Any]:
        # what the driver's and the executors' Python processes unpickle: no handle, no
        # processor (they are built there)
        return {"factory": self.factory, "args": self.args, "declarations": self.declarations}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._handle = None
        self._variables = []
        self._processor = None
