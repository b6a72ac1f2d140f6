"""extract/transport/pages.py: positioned reads that the system may answer in pieces."""
import os

import numpy as np

from headforms.extract import open_checkpoint
from headforms.extract.transport import pages
from tests import tiny_models


def in_pieces(monkeypatch, most: int = 7):
    """os.preadv answering at most `most` bytes a call (as a signal or a network file system may), the rest later."""
    real = os.preadv
    monkeypatch.setattr(pages.os, "preadv", lambda fd, views, offset: real(fd, [views[0][:most]], offset))


def test_a_read_answered_in_pieces_continues_where_the_last_piece_ended(tmp_path, monkeypatch):
    data = np.random.default_rng(0).integers(0, 256, 1000, dtype=np.uint8).tobytes()
    (tmp_path / "f").write_bytes(data)
    in_pieces(monkeypatch)
    with pages.open_unbuffered(tmp_path / "f") as f:
        for offset, size in ((0, 1000), (3, 50), (997, 3), (990, 64)):
            buf = bytearray(size)
            done = pages.read_into(f.fileno(), memoryview(buf), offset)
            assert done == min(size, 1000 - offset) and bytes(buf[:done]) == data[offset:offset + done]


def test_a_layer_read_in_pieces_is_the_same_tensor(tmp_path, monkeypatch):
    """A tiny llama's query and key maps, read through reads of 7 bytes at a time, equal those of whole reads."""
    folder = tiny_models.save(tiny_models.build("llama_gqa"), tmp_path / "llama")
    whole = open_checkpoint(str(folder)).read_layer(1)
    in_pieces(monkeypatch)
    pieces = open_checkpoint(str(folder)).read_layer(1)
    for a, b in zip(whole, pieces):
        np.testing.assert_array_equal(a, b)
