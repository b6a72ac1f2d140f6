"""File bytes and the page cache: exact positioned reads without readahead, and files written once given back.

A checkpoint's Q/K spans are read with positioned reads of exactly their bytes, readahead off, so that only
those pages come off the disk. A hub range is written to the range cache once and not read back in the same
run (the layers fetched ahead are held in memory), so its file is flushed and its pages given back at once:
the cache does not grow the page cache by the checkpoint's Q/K bytes (2.1 GB for a 24B model), and on a virtual
machine that hands free memory back to its host the next range is written into pages just freed instead of
fresh ones (measured in the README, Performance).
"""
from __future__ import annotations

import os

_ADVICE = hasattr(os, "posix_fadvise")


def open_unbuffered(path):
    """A raw file without kernel readahead: a read brings in the pages asked for and no more (the device's
    readahead window can be megabytes, a large share of a small tensor)."""
    f = open(path, "rb", buffering=0)
    if _ADVICE:
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_RANDOM)
    return f


def read_into(fd: int, view: memoryview, offset: int) -> int:
    """Fill `view` with the file's bytes from `offset` by positioned reads (no copy); the bytes read, fewer only
    where the file ends."""
    done = 0
    while done < len(view) and (got := os.preadv(fd, [view[done:]], offset + done)):
        done += got
    return done


def written(fd: int) -> None:
    """After writing a file that this run will not read: flush it to the disk (a file renamed into place after this
    holds its bytes, even after a crash) and give back its pages."""
    getattr(os, "fdatasync", os.fsync)(fd)
    if _ADVICE:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
