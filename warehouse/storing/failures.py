"""Failures said in one line: where a run failed (step, model, layer), carried on the exception to the command
line; a model kept incomplete; an output folder that cannot be created; any failure as the line a user reads."""
from __future__ import annotations

import errno
import os
import re
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from headforms.extract.checkpoint import ExtractError, first_line


class WarehouseError(Exception):
    """A warehouse that cannot be opened or changed as asked; one line for the user."""


def damaged(how: str) -> str:
    """The line for a warehouse file whose bytes are not those DuckDB wrote, `how` saying what is wrong with them."""
    return (f"the warehouse file is damaged ({how}): `headforms check` names the tables that no longer read; "
            "restore the file from a copy, or extract into a new one")


def _from_duckdb(exc: BaseException) -> bool:
    """Whether DuckDB raised `exc`. Asked without importing DuckDB, which a worker process never loads: an error
    of DuckDB's means the module is loaded."""
    duckdb = sys.modules.get("duckdb")
    return duckdb is not None and isinstance(exc, duckdb.Error)


@dataclass(frozen=True)
class Place:
    """The step that failed ('open', 'read', 'compute', 'write', 'summaries (...)', 'export ...', 'report ...'),
    with the model and layer(s) it was working on where known."""

    step: str
    model: str | None = None
    layer: int | tuple[int, int] | None = None  # a commit's (first, last) layers

    def __str__(self) -> str:
        words = [f"model '{self.model}'"] if self.model is not None else []
        if isinstance(self.layer, tuple):
            first, last = self.layer
            words.append(f"layer {first}" if first == last else f"layers {first}-{last}")
        elif self.layer is not None:
            words.append(f"layer {self.layer}")
        return ", ".join([*words, f"step {self.step}"])


@contextmanager
def stage(step: str, model: str | None = None, layer: int | tuple[int, int] | None = None):
    """Labels an exception raised inside with where it happened (the innermost label wins); it travels with the
    exception, across worker processes too (it is in the exception's __dict__, which pickling keeps)."""
    try:
        yield
    except Exception as exc:
        if place_of(exc) is None:
            exc.headforms_place = Place(step, model, layer)
        raise


def place_of(exc: BaseException) -> Place | None:
    """Where `exc` happened, if a stage labelled it."""
    return getattr(exc, "headforms_place", None)


def words(exc: BaseException) -> str:
    """An exception in one line: an OS error's reason and path, else its type and the first line of its message."""
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.strerror}: {exc.filename}" if exc.filename else exc.strerror
    return first_line(exc, typed=True)


class ModelIncomplete(WarehouseError):
    """A step after a model's last layer failed: its layers are kept, models.failed_step names the step, and the
    same command finishes it. Raised from the original exception (its traceback is the cause)."""


def writable_folder(folder: Path) -> None:
    """Create an output folder (and its parents), or say in one line why it cannot be."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise WarehouseError(f"cannot create the output folder {folder} ({exc.filename}: {exc.strerror}): "
                             f"choose a folder you can write with out=DIR") from None


# DuckDB's words for a warehouse file whose bytes are not those it wrote: a block whose checksum fails, a block past
# the end of a file cut short.
DAMAGED = ("Corrupt database file", "IO Error: Could not read enough bytes from file")


# A full disk (or quota), as the OS says it, and so in DuckDB's messages for the files it could not write.
NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


def no_space(exc: BaseException) -> str | None:
    """The OS's words and the file, where `exc` is a write that found the disk full (else None): then what was
    committed stays (undoing it would need space too), and the same command goes on from there once space is freed."""
    if isinstance(exc, OSError) and exc.errno in NO_SPACE:
        return words(exc)
    if _from_duckdb(exc):
        for reason in map(os.strerror, NO_SPACE):
            if reason in str(exc):
                file = re.search(r'Could not write file "([^"]+)"', str(exc))
                return f"{reason}: {file.group(1)}" if file else reason
    return None


def duckdb_words(exc: BaseException) -> str:
    """DuckDB's message whole, on one line: its hints ('Did you mean "heads"?') and the query line it points at,
    without the caret line (whose place a single line loses)."""
    lines = [line.strip() for line in str(exc).splitlines()]
    return " ".join(line for line in lines if line and set(line) - {"^", " "}) or type(exc).__name__


def one_line(exc: Exception) -> tuple[str, bool]:
    """A failure as the one line a user reads, and whether its traceback is worth keeping: the tool's own refusals
    (and DuckDB's words on a query) stand alone, a damaged warehouse file is named as such; anything else says where
    it happened and what it was."""
    place = place_of(exc)
    if isinstance(exc, ModelIncomplete):
        return str(exc), True
    if _from_duckdb(exc) and first_line(exc).startswith(DAMAGED):
        return damaged(first_line(exc)), False
    if full := no_space(exc):
        if place is not None and place.step.startswith(("export", "report")):
            then = "free space on it or choose another folder with `out`, then run the same command again"
        else:
            then = "free space on it, then run the same command again (an extraction goes on from its last commit)"
        return f"{f'{place}: ' if place else ''}the disk is full ({full}): {then}", False
    if _from_duckdb(exc) and place is None:
        return duckdb_words(exc), False
    if isinstance(exc, (ExtractError, WarehouseError)):
        return first_line(exc), False
    return f"{f'{place}: ' if place else ''}{words(exc)}", True
