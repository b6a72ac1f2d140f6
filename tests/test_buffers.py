"""A layer's arrays reuse the memory of the layer before them once it is freed, and never memory still in use."""
import gc
import threading

import numpy as np
import torch

from headforms.extract import open_checkpoint
from headforms.extract.buffers import BufferPool
from tests import tiny_models


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
