"""A worker's exception, carried to the consumer and re-raised there as torch re-raises it.

torch's DataLoader re-raises an exception from a worker with the dataset's own type, so code
that catches ``KeyError`` keeps working; stoker does the same, and adds where it happened
(batch, worker, and for processes the worker's traceback) as a note (PEP 678). An exception
object that cannot cross a process boundary is rebuilt as ``type(message)`` like torch's
``ExceptionWrapper.reraise``, else a ``RuntimeError`` naming the original type.
"""

from __future__ import annotations

import pickle
import traceback
from typing import Any, NoReturn

__all__ = ["WorkerFailure", "add_note"]


def add_note(exc: BaseException, note: str) -> None:
    """``exc.add_note(note)`` where Python has it (3.11+); nothing on older versions."""
    adder = getattr(exc, "add_note", None)
    if adder is not None:
        adder(note)


# What pickling an arbitrary object (and rebuilding it) may raise: it is then sent as text.
_UNPICKLABLE = (pickle.PicklingError, pickle.UnpicklingError, TypeError, AttributeError,
                ValueError, RecursionError, NotImplementedError, ImportError)


def _pickles(obj: Any) -> bool:
    try:
        pickle.loads(pickle.dumps(obj))
    except _UNPICKLABLE:
        return False
    return True


class WorkerFailure:
    """What a worker hands back instead of a batch when producing it raised.

    Args:
        exc: the exception.
        where: the worker, as the message should name it (``"worker 1 (pid 812)"``).
        local: the consumer is in this process (thread workers), so the exception object
            itself, traceback included, is handed over; otherwise it must survive pickling.
    """

    def __init__(self, exc: BaseException, where: str, local: bool) -> None:
        self.where = where
        self.local = local
        self.kind = type(exc)
        self.name = type(exc).__qualname__
        self.trace = "".join(traceback.format_exception(exc))
        self.exc: BaseException | None = exc if local or _pickles(exc) else None
        if self.exc is None and not _pickles(self.kind):
            self.kind = None  # type: ignore[assignment]

    def reraise(self, what: str) -> NoReturn:
        """Raise the worker's exception in the consumer; ``what`` names the failed batch."""
        head = f"Caught {self.name} in DataLoader {self.where} while producing {what}."
        if self.exc is not None:
            note = head if self.local else f"{head}\nOriginal {self.trace}"
            add_note(self.exc, note)
            raise self.exc
        message = f"{head}\nOriginal {self.trace}"
        try:
            rebuilt = self.kind(message) if self.kind is not None else None
        except (TypeError, ValueError, AttributeError):  # a type taking other arguments (torch)
            rebuilt = None
        if rebuilt is None:
            raise RuntimeError(message) from None
        raise rebuilt
