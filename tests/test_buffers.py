"""A layer's arrays reuse the memory of the layer before them once it is freed, and never memory still in use; a
process that computes layers keeps the memory its temporaries free (glibc's malloc, compute.threads)."""
import gc
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import torch

from headforms.compute import threads
from headforms.extract import open_checkpoint
from headforms.extract.transport.buffers import PAGE, BufferPool
from tests import tiny_models

ROOT = Path(__file__).resolve().parents[1]


def address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def test_a_freed_array_s_memory_is_reused_by_the_next_of_its_size():
    pool = BufferPool()
    first = pool.empty((3, 4))
    first[:] = 1.5
    where = address(first)
    view = first[1:]
    del first
    gc.collect()
    second = pool.empty((4, 3))  # a view of the first is alive: its memory is not lent again
    assert address(second) != where
    second[:] = -2.0
    assert (view == 1.5).all()
    del view
    other = np.empty(96, np.uint8)  # malloc would give it the memory just freed; the pool holds it
    assert address(pool.empty(12)) == where != address(other)  # lent again now (any shape of the same byte size)
    assert address(pool.empty(6, np.int32)) != where  # another size gets other memory


def test_the_pool_keeps_at_most_keep_idle_buffers_of_a_size_and_clear_frees_them():
    pool = BufferPool(keep=1)
    a, b = pool.empty(1000), pool.empty(1000)
    kept = address(a)
    del a, b  # a is given back first and kept; b finds one idle already and is freed
    assert pool.idle_bytes == 8000
    c = pool.empty((10, 100))
    assert address(c) == kept and pool.idle_bytes == 0
    del c
    pool.clear()
    assert pool.idle_bytes == 0


def test_arrays_from_the_pool_are_ordinary_writable_arrays():
    pool = BufferPool()
    a = pool.empty((2, 0, 3))
    assert a.shape == (2, 0, 3) and a.dtype == np.float64
    b = pool.empty((5, 7), np.uint8)
    b[:] = 7
    assert b.flags.writeable and b.flags.c_contiguous and b.dtype == np.uint8 and b.sum() == 7 * 35
    assert address(a) % PAGE == address(b) % PAGE == 0  # each starts on a page (a hub range is written from it)
    t = torch.from_numpy(pool.empty((2, 2)))
    t.copy_(torch.eye(2, dtype=torch.bfloat16))
    assert t.numpy().tolist() == [[1.0, 0.0], [0.0, 1.0]]


def test_a_checkpoint_s_layers_reuse_the_memory_of_the_layers_freed_before_them(tmp_path):
    model = tiny_models.build("llama_gqa", dtype=torch.bfloat16, num_hidden_layers=3)
    tiny_models.save(model, tmp_path / "llama", "sharded")
    ckpt = open_checkpoint(str(tmp_path / "llama"))
    first = ckpt.read_layer(0)
    kept = [a.copy() for a in first]
    second = ckpt.read_layer(1)  # layer 0 still held: layer 1 gets memory of its own
    assert not any(np.shares_memory(a, b) for a in first for b in second)
    assert all((a == b).all() for a, b in zip(first, kept))
    where = {address(a) for a in first}
    del first
    # arrays of the same sizes as layer 0's maps and their bfloat16 bytes: malloc would give them the memory just
    # freed, but the checkpoint's pool holds it for its next layer
    others = [np.empty(a.nbytes // k, np.uint8) for a in kept for k in (1, 4)]
    third = ckpt.read_layer(2)
    assert {address(a) for a in third} == where
    assert not {address(a) for a in others} & where
    for layer, (wq, wk) in ((1, second), (2, third)):
        attn = model.model.layers[layer].self_attn
        assert np.array_equal(wq.reshape(-1, wq.shape[-1]), attn.q_proj.weight.detach().double().numpy())
        assert np.array_equal(wk.reshape(-1, wk.shape[-1]), attn.k_proj.weight.detach().double().numpy())
    ckpt.close()


def test_an_array_freed_inside_the_pool_s_locked_section_gives_its_buffer_back():
    """The garbage collector may free a pooled array at any allocation, one inside the pool's locked section
    included: giving its buffer back then must not wait for that lock (it would wait forever)."""
    pool = BufferPool()
    held = [pool.empty(100)]

    def free_inside():
        with pool._lock:
            held.clear()

    thread = threading.Thread(target=free_inside, daemon=True)
    thread.start()
    thread.join(10)
    assert not thread.is_alive()
    assert pool.idle_bytes == 800


def _reallocation_faults(setup: str) -> int:
    """tests/reallocations.py's count in a fresh process, after `setup`."""
    code = f"{setup}\nfrom tests.reallocations import faults; print(faults())"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert run.returncode == 0, run.stderr
    return int(run.stdout)


def test_a_process_that_keeps_freed_memory_reuses_it():
    """After keep_freed_memory (glibc here), a thread's large temporaries land in memory freed before, not on new
    pages; without it, on new pages each time."""
    from tests.reallocations import ONE_BLOCK

    assert _reallocation_faults("") >= 5 * ONE_BLOCK
    kept = "from headforms.compute.threads import keep_freed_memory; assert keep_freed_memory()"
    assert _reallocation_faults(kept) < ONE_BLOCK


def test_the_command_and_a_jobs_worker_keep_freed_memory():
    """The `headforms` process sets it before its command runs; a `--jobs` worker at its start."""
    from headforms.warehouse.running.executors import Processes
    from tests import reallocations

    patched = ("import headforms.api as a; real = a.keep_freed_memory; "
               "a.keep_freed_memory = lambda: print('@kept', flush=True) or real(); "
               "import sys; sys.argv = ['headforms', 'models']; from headforms import cli; cli.run()")
    run = subprocess.run([sys.executable, "-c", patched], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert run.returncode == 0 and run.stdout.startswith("@kept\n"), (run.stdout, run.stderr)
    work = Processes(1)
    try:
        assert work.pool.submit(reallocations.faults).result(timeout=120) < reallocations.ONE_BLOCK
    finally:
        work.close()


class _Mallopt:
    """A C library's mallopt, recording its calls."""

    def __init__(self):
        self.calls = []

    def mallopt(self, param, value):
        self.calls.append((param, value))
        return 1


def test_keep_freed_memory_leaves_the_user_s_settings_and_other_c_libraries_alone(monkeypatch):
    """mallopt is called for each setting whose variable the user has not set, for none where GLIBC_TUNABLES names
    malloc, and a C library without mallopt (not glibc) changes nothing."""
    libc = _Mallopt()
    monkeypatch.setattr(threads.ctypes, "CDLL", lambda name: libc)
    for name in (*threads.KEEP_FREED_MEMORY, "GLIBC_TUNABLES"):
        monkeypatch.delenv(name, raising=False)
    assert threads.keep_freed_memory()
    assert libc.calls == [(-4, 0), (-1, 1 << 30)]  # M_MMAP_MAX, M_TRIM_THRESHOLD
    libc.calls.clear()
    monkeypatch.setenv("MALLOC_MMAP_MAX_", "65536")
    assert threads.keep_freed_memory() and libc.calls == [(-1, 1 << 30)]
    libc.calls.clear()
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.trim_threshold=0")
    assert threads.keep_freed_memory() and libc.calls == []
    monkeypatch.setattr(threads.ctypes, "CDLL", lambda name: object())
    assert threads.keep_freed_memory() is False
