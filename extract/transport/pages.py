"""File bytes and the page cache: exact positioned reads without readahead, and files written once given back.

A checkpoint's Q/K spans are read with positioned reads of exactly their bytes, readahead off, so that only
those pages come off the disk. A hub range is written to the range cache once and not read back in the same
run (the layers fetched ahead are held in memory), so its file is flushed and its pages given back at once:
the cache does not grow the page cache by the checkpoint's Q/K bytes (2.1 GB for a 24B model). Its whole blocks go
straight from the range's buffer to the disk (O_DIRECT), with no copy into the page cache at all, where the buffer
starts on a page and the file system allows it (measured in docs/performance.md).
"""
from __future__ import annotations

import errno
import fcntl
import os

import numpy as np

_ADVICE = hasattr(os, "posix_fadvise")
_DIRECT = getattr(os, "O_DIRECT", 0)
BLOCK = 4096  # O_DIRECT's unit: of the file's offsets and lengths, and of the memory written from


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


def write_once(path, data: memoryview) -> None:
    """A new file of `data` that this run will not read: its whole blocks written straight to the disk where `data`
    starts on a block (a pooled buffer) and the file system takes O_DIRECT, the rest through the page cache; then
    flushed and its pages given back (`written`)."""
    data = memoryview(data).cast("B")
    whole = len(data) // BLOCK * BLOCK if _DIRECT and len(data) and _address(data) % BLOCK == 0 else 0
    with open(path, "wb") as f:
        done = _direct_write(f.fileno(), data[:whole]) if whole else 0
        f.seek(done)
        f.write(data[done:])
        f.flush()
        written(f.fileno())


def _address(data: memoryview) -> int:
    return np.frombuffer(data, np.uint8).ctypes.data


def _direct_write(fd: int, data: memoryview) -> int:
    """Write what O_DIRECT takes of `data` (whole blocks, starting on a block) at the start of the open file `fd`:
    the bytes written, 0 where the file system refuses it (the caller writes the rest through the page cache)."""
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    try:
        fcntl.fcntl(fd, fcntl.F_SETFL, flags | _DIRECT)
    except OSError:
        return 0
    done = 0
    try:
        while done < len(data) and done % BLOCK == 0:  # a short write off a block ends it
            done += os.pwrite(fd, data[done:], done)
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise
    finally:
        fcntl.fcntl(fd, fcntl.F_SETFL, flags)
    return done


def written(fd: int) -> None:
    """After writing a file that this run will not read: flush it to the disk (a file renamed into place after this
    holds its bytes, even after a crash) and give back its pages."""
    getattr(os, "fdatasync", os.fsync)(fd)
    if _ADVICE:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
