"""Array buffers reused from layer to layer: a layer's float64 maps come in the same sizes every layer, and a fresh
array of that size costs the kernel zeroing its pages (and, on a virtual machine that hands freed memory back to
its host, the host faulting them in again): 6% of the CPU of a 24B-shaped extraction before (docs/performance.md
has the profiles).
A buffer goes back to its pool when the last array that views it is freed, so no array ever shares its memory with
another one in use. Its arrays start on a page (PAGE), so that a hub range can be written to its file straight from
them (pages.write_once).
"""
from __future__ import annotations

import math
import threading
from collections import deque

import numpy as np

from headforms.extract.transport.pages import BLOCK

PAGE = BLOCK  # where a pooled array starts: a multiple of O_DIRECT's unit (pages.BLOCK)


class _Lease:
    """The owner of a pooled buffer while arrays view it: numpy keeps it as their base, and when the last of them is
    freed it gives the buffer back."""

    def __init__(self, pool: BufferPool, size: int, buffer: np.ndarray, shape: tuple[int, ...], dtype: np.dtype):
        self.pool, self.size, self.buffer = pool, size, buffer
        start = buffer.ctypes.data + (-buffer.ctypes.data) % PAGE
        self.__array_interface__ = {"version": 3, "shape": shape, "typestr": dtype.str, "data": (start, False)}

    def __del__(self):
        self.pool.give_back(self.size, self.buffer)


class BufferPool:
    """Uninitialised arrays whose memory is reused once the arrays before them are freed: at most `keep` idle
    buffers of each size are kept (a layer's arrays are freed, and the next layer's taken, one at a time)."""

    def __init__(self, keep: int = 2):
        self.keep = keep
        self._idle: dict[int, list[np.ndarray]] = {}
        self._returned: deque = deque()  # (size, buffer) given back, not yet sorted into _idle
        self._lock = threading.Lock()

    def empty(self, shape, dtype=np.float64) -> np.ndarray:
        """Like np.empty(shape, dtype), in an idle buffer of the same byte size when there is one."""
        shape = (int(shape),) if np.ndim(shape) == 0 else tuple(int(d) for d in shape)
        dtype = np.dtype(dtype)
        size = math.prod(shape) * dtype.itemsize
        with self._lock:
            self._sort_returned()
            idle = self._idle.get(size)
            buffer = idle.pop() if idle else None
        if buffer is None:
            buffer = np.empty(size + PAGE, np.uint8)  # room to start on a page
        return np.asarray(_Lease(self, size, buffer, shape, dtype))

    def give_back(self, size: int, buffer: np.ndarray) -> None:
        """A buffer of `size` bytes no array views any more. A lease gives it back as it is freed, which the garbage
        collector may do at any allocation, this pool's own included: so this takes no lock, it only appends."""
        self._returned.append((size, buffer))

    def _sort_returned(self) -> None:
        """Under the lock: the buffers given back kept for the next arrays of their size, up to `keep` a size."""
        while self._returned:
            size, buffer = self._returned.popleft()
            idle = self._idle.setdefault(size, [])
            if len(idle) < self.keep:
                idle.append(buffer)

    @property
    def idle_bytes(self) -> int:
        """Bytes the pool holds for arrays to come."""
        with self._lock:
            self._sort_returned()
            return sum(size * len(idle) for size, idle in list(self._idle.items()))

    def clear(self) -> None:
        """Free the idle buffers (arrays still in use keep theirs until they are freed)."""
        with self._lock:
            self._returned.clear()
            self._idle.clear()
