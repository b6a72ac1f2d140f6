"""Broken and foreign files in the user's words: a GGUF, safetensors or torch .bin file cut short or run on
past its last tensor names its size, the size its header describes and the first missing tensor (locally
and from the hub), --plan still plans it from its header, and a checkpoint in a format headforms does not
read (CTranslate2, ONNX, MLX, GGML, TensorFlow, Flax, GPTQ, AWQ) is named with what to give instead. Each
through the CLI: one Error line, a non-zero exit, the warehouse as it was."""
from __future__ import annotations

import json
import re
import shutil
import struct
import zipfile
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from click.testing import CliRunner
from safetensors.numpy import save_file

from headforms import api, cli
from headforms.extract.checkpoint import ExtractError, ReadOptions
from headforms.extract.formats.gguf_file import open_gguf
from headforms.extract.formats.hf import torch_zip_extent
from headforms.extract.formats.unreadable import FOREIGN, human_size
from tests import tiny_models as tm
from tests.test_gguf import SMOL, write_gguf
from tests.test_hub import hub, serve  # noqa: F401  (the local hub fixture)

UNITS = {"byte": 1, "bytes": 1, "kB": 1e3, "MB": 1e6, "GB": 1e9}
SIZES = re.compile(r"it is (?P<a>[\d.,]+ \w+) but its header describes (?P<least>at least )?(?P<b>[\d.,]+ \w+): ")


def in_bytes(words: str) -> float:
    """'9.93 kB' or '12,927 bytes' as a byte count."""
    number, unit = words.split()
    return float(number.replace(",", "")) * UNITS[unit]


def assert_sizes(message: str, actual: int, described: int, *, at_least: bool = False) -> None:
    """The message gives the file's size and the size its header describes, to the precision of their words."""
    found = SIZES.search(message)
    assert found, message
    assert bool(found["least"]) == at_least
    for words, true in ((found["a"], actual), (found["b"], described)):
        assert abs(in_bytes(words) - true) <= max(0.0005 * true, 0.5 * UNITS[words.split()[1]] / 100), (words, true)
    assert in_bytes(found["a"]) != in_bytes(found["b"])  # never two equal-looking sizes


def invoke(*args) -> object:
    return CliRunner().invoke(cli.main, [str(a) for a in args])


def assert_one_error(result, pattern: str) -> str:
    """Exit status 1 and exactly one line, `Error: ...` matching pattern; no traceback."""
    assert result.exit_code == 1, (result.exit_code, result.output, result.exception)
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and re.search(pattern, lines[0]), result.output
    assert lines[0].startswith("Error: ") and "Traceback" not in result.output
    return lines[0]


@pytest.fixture(scope="module")
def base_db(tmp_path_factory):
    """A warehouse holding one tiny model, to check that a refused source leaves it byte for byte as it was."""
    folder = tm.save(tm.build("llama"), tmp_path_factory.mktemp("base") / "base")
    db = folder.parent / "base.duckdb"
    api.extract(str(folder), db=db, name="base", resamples=10)
    return db


@pytest.fixture(params=[True, False], ids=["warehouse", "no warehouse"])
def db(request, base_db, tmp_path):
    """A warehouse path: a copy of base_db, or none yet."""
    path = tmp_path / "w.duckdb"
    if request.param:
        shutil.copy(base_db, path)
    return path


def refused(db: Path, source, pattern: str, *extra) -> str:
    """Extract source into db through the CLI: one error line matching pattern, db as it was (or still absent)."""
    before = db.read_bytes() if db.exists() else None
    line = assert_one_error(invoke("extract", source, "--db", db, *extra), pattern)
    assert (db.read_bytes() if db.exists() else None) == before
    return line


def tensor_spans_gguf(path: Path) -> list[tuple[str, int, int]]:
    """(name, start, end) of each tensor in file order, by the gguf package's own reader."""
    reader = gguf.GGUFReader(path)
    return sorted(((t.name, int(t.data_offset), int(t.data_offset) + int(t.n_bytes)) for t in reader.tensors),
                  key=lambda t: t[1])


def first_cut(spans, keep: int) -> str:
    return next(name for name, _, end in spans if end > keep)


# GGUF -------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def smol_spans():
    return tensor_spans_gguf(SMOL)


def cut_file(source: Path, target: Path, keep: int) -> Path:
    with open(source, "rb") as f:
        target.write_bytes(f.read(keep))
    return target


def test_truncated_smollm2_names_both_sizes_and_the_first_missing_tensor(smol_spans, db, tmp_path):
    keep = 50_000_000
    cut = cut_file(SMOL, tmp_path / "model.gguf", keep)
    line = refused(db, cut, rf"^Error: cannot read {re.escape(str(cut))}: it is .* the download is incomplete "
                            rf"\(first missing tensor: {re.escape(first_cut(smol_spans, keep))}\); download it again$")
    assert_sizes(line, keep, max(end for _, _, end in smol_spans))


def test_plan_of_a_truncated_gguf_reads_its_header_and_warns(smol_spans, tmp_path):
    cut = cut_file(SMOL, tmp_path / "model.gguf", 50_000_000)
    whole = api.plan(str(SMOL))
    result = CliRunner().invoke(cli.main, ["extract", str(cut), "--plan"])
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.stderr.splitlines() if line.startswith("Warning: ")]
    assert len(warnings) == 1 and "the download is incomplete (first missing tensor: " in warnings[0]
    plan = api.plan(str(cut))
    assert plan["heads"].to_list() == whole["heads"].to_list() == [30 * 9]
    assert plan["qk_bytes"].to_list() == whole["qk_bytes"].to_list()
    assert plan["checkpoint_bytes"].to_list() == [50_000_000]
    assert whole["warning"].to_list() == [None] and plan["warning"][0] == warnings[0].removeprefix("Warning: ")


@pytest.mark.parametrize("keep", [0, 10, 1_000_000])
def test_gguf_cut_inside_its_header(keep, db, tmp_path):
    """Cut before the tensor table ends (empty, inside the counts, inside the tokenizer's metadata)."""
    cut = cut_file(SMOL, tmp_path / "model.gguf", keep)
    refused(db, cut, rf"^Error: cannot read .*model\.gguf: it is {re.escape(human_size(keep))} and ends inside its "
                     r"GGUF header \(metadata and tensor table\): the download is incomplete; download it again$")


def gguf_with_odd_last_tensor(path: Path) -> Path:
    """A tiny GGUF whose last tensor ends off the 32-byte alignment (the writer pads the file after it)."""
    rng = np.random.default_rng(0)
    weights = {f"blk.{i}.attn_{kind}.weight": rng.standard_normal((heads * 8, 32)).astype(np.float32)
               for i in range(2) for kind, heads in (("q", 4), ("k", 2))}
    write_gguf(path, weights=weights | {"output_norm.weight": np.ones(3, np.float32)})
    return path


def test_gguf_padded_after_its_last_tensor_is_whole(tmp_path):
    path = gguf_with_odd_last_tensor(tmp_path / "m.gguf")
    spans = tensor_spans_gguf(path)
    assert spans[-1][2] % 32 and path.stat().st_size == -(-spans[-1][2] // 32) * 32  # padding follows
    checkpoint = open_gguf(path, name="m", source="m", options=ReadOptions(revision="r"))
    assert checkpoint.read_layer(1)[0].shape == (4, 8, 32)
    path.write_bytes(path.read_bytes()[:spans[-1][2]])  # the padding is not missing data
    open_gguf(path, name="m", source="m", options=ReadOptions(revision="r"))


@pytest.mark.parametrize("extra", [33, 5000])
def test_overlong_gguf_is_refused(extra, db, tmp_path):
    path = gguf_with_odd_last_tensor(tmp_path / "m.gguf")
    size, end = path.stat().st_size, tensor_spans_gguf(path)[-1][2]
    path.write_bytes(path.read_bytes() + bytes(extra))
    line = refused(db, path, r"^Error: cannot read .*m\.gguf: it is .* but its header describes .*: its last tensor "
                             r"is followed by .*, so it is not the file its header describes .*; download it again$")
    assert_sizes(line, size + extra, end)
    assert f"followed by {human_size(size + extra - end)}," in line


def test_gguf_cut_in_its_last_tensor_names_it(db, tmp_path):
    path = gguf_with_odd_last_tensor(tmp_path / "m.gguf")
    spans = tensor_spans_gguf(path)
    keep = spans[-2][1] + 5  # inside the second-to-last tensor
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(path.read_bytes()[:keep])
    line = refused(db, cut, rf"first missing tensor: {re.escape(spans[-2][0])}\)")
    assert_sizes(line, keep, spans[-1][2])


# safetensors ------------------------------------------------------------------------------------

@pytest.fixture
def llama(tmp_path) -> Path:
    return tm.save(tm.build("llama"), tmp_path / "llama")


def safetensors_spans(path: Path) -> list[tuple[str, int, int]]:
    """(name, start, end) in file order, from the header's JSON read here."""
    raw = path.read_bytes()
    length = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + length])
    return sorted(((name, 8 + length + info["data_offsets"][0], 8 + length + info["data_offsets"][1])
                   for name, info in header.items() if name != "__metadata__"), key=lambda t: t[1])


def test_truncated_safetensors(llama, db):
    path = llama / "model.safetensors"
    spans, size = safetensors_spans(path), path.stat().st_size
    keep = size // 2
    path.write_bytes(path.read_bytes()[:keep])
    line = refused(db, llama, rf"^Error: cannot read {re.escape(str(path))}: it is .* the download is incomplete "
                              rf"\(first missing tensor: {re.escape(first_cut(spans, keep))}\); download it again$")
    assert_sizes(line, keep, size)


def test_safetensors_cut_inside_its_header(llama, db):
    path = llama / "model.safetensors"
    path.write_bytes(path.read_bytes()[:100])
    refused(db, llama, r"it is 100 bytes and ends inside its safetensors header: the download is incomplete")


def test_overlong_safetensors(llama, db):
    path = llama / "model.safetensors"
    size = path.stat().st_size
    path.write_bytes(path.read_bytes() + b"\0")
    refused(db, llama, rf"it is {size + 1:,} bytes but its header describes {size:,} bytes: its last tensor is "
                       r"followed by 1 byte, so it is not the file its header describes")


def test_plan_of_a_truncated_safetensors_folder(llama):
    whole = api.plan(str(llama))
    path = llama / "model.safetensors"
    path.write_bytes(path.read_bytes()[:path.stat().st_size // 2])
    plan = api.plan(str(llama))
    assert plan["qk_bytes"].to_list() == whole["qk_bytes"].to_list() and plan["heads"].to_list() == [8]
    assert "the download is incomplete" in plan["warning"][0] and whole["warning"][0] is None


# torch .bin (zip) -------------------------------------------------------------------------------

@pytest.fixture
def llama_bin(tmp_path) -> Path:
    return tm.save(tm.build("llama"), tmp_path / "llama_bin", "bin")


def storage_spans(path: Path) -> list[tuple[str, int, int]]:
    """(tensor, start, end) of each tensor's storage record, in file order: torch.save writes one storage per
    tensor here (none share), keyed 0, 1, ... in the state dict's order."""
    names = list(torch.load(path, weights_only=True))
    with zipfile.ZipFile(path) as archive, open(path, "rb") as f:
        spans = []
        for info in archive.infolist():
            folder, _, key = info.filename.partition("/data/")
            if key.isdigit() and "/" not in folder:
                f.seek(info.header_offset + 26)
                name_len, extra_len = struct.unpack("<HH", f.read(4))
                start = info.header_offset + 30 + name_len + extra_len
                spans.append((names[int(key)], start, start + info.compress_size))
    return sorted(spans, key=lambda t: t[1])


def test_truncated_bin(llama_bin, db):
    path = llama_bin / "pytorch_model.bin"
    spans, size = storage_spans(path), path.stat().st_size
    keep = spans[len(spans) // 2][1] + 7  # inside a storage in the middle
    path.write_bytes(path.read_bytes()[:keep])
    line = refused(db, llama_bin, rf"^Error: cannot read {re.escape(str(path))}: it is .* the download is incomplete "
                                  rf"\(first missing tensor: {re.escape(first_cut(spans, keep))}\); download it again$")
    found = SIZES.search(line)
    assert found["least"] and keep < in_bytes(found["b"]) <= size * 1.0005  # the records still needed, at least


def test_bin_cut_inside_its_end_record_needs_exactly_its_size(llama_bin):
    """One byte short, inside the end-of-directory record: every storage is there, and the bytes the header needs
    at least are the whole file's (said to the byte, the two sizes reading alike in kB)."""
    raw = (llama_bin / "pytorch_model.bin").read_bytes()
    problem = torch_zip_extent(lambda offset, n: raw[offset:offset + n], len(raw) - 1, "z.bin")
    assert str(problem) == (f"cannot read z.bin: it is {len(raw) - 1:,} bytes but its header describes at least "
                            f"{len(raw):,} bytes: the download is incomplete; download it again")


def test_plan_of_a_truncated_bin_folder(llama_bin):
    whole = api.plan(str(llama_bin))
    path = llama_bin / "pytorch_model.bin"
    path.write_bytes(path.read_bytes()[:path.stat().st_size // 2])
    plan = api.plan(str(llama_bin))
    assert plan["qk_bytes"].to_list() == whole["qk_bytes"].to_list()
    assert "the download is incomplete (first missing tensor: " in plan["warning"][0]


def test_bin_cut_inside_data_pkl(llama_bin, db):
    path = llama_bin / "pytorch_model.bin"
    path.write_bytes(path.read_bytes()[:200])
    refused(db, llama_bin, r"it is 200 bytes and ends inside its torch header \(data\.pkl\): "
                           r"the download is incomplete")


@pytest.mark.parametrize("extra", [1, 70_000])  # within and beyond the 64 kB zipfile searches for its end record
def test_overlong_bin(extra, llama_bin, db):
    path = llama_bin / "pytorch_model.bin"
    size = path.stat().st_size
    path.write_bytes(path.read_bytes() + bytes(extra))
    line = refused(db, llama_bin, r"its last tensor is followed by .*, so it is not the file its header describes")
    assert_sizes(line, size + extra, size)


def zip64_copy(source: Path, target: Path, monkeypatch) -> Path:
    """source's records rewritten as a checkpoint over 4 GB is written: zip64 data descriptors (24 bytes) and
    zip64 end records (the limits lowered so that a small file gets them), streamed so each record has a descriptor."""
    monkeypatch.setattr(zipfile, "ZIP64_LIMIT", 64)

    class Stream:  # unseekable: zipfile writes data descriptors
        def __init__(self, f):
            self.f, self.n = f, 0

        def write(self, data):
            self.n += len(data)
            return self.f.write(data)

        def tell(self):
            return self.n

        def flush(self):
            self.f.flush()

    with zipfile.ZipFile(source) as archive, open(target, "wb") as f:
        with zipfile.ZipFile(Stream(f), "w", zipfile.ZIP_STORED) as out:
            for info in archive.infolist():
                with out.open(info.filename, "w", force_zip64=True) as record:
                    record.write(archive.read(info))
    return target


def test_the_unpickler_takes_only_torch_storage_ids():
    """data.pkl's persistent ids must be torch's ('storage', storage type, key, location, elements); any other is
    refused before anything is built from it."""
    import io
    import pickle

    from headforms.extract.formats.torch_pickle import RecordingUnpickler, Storage, StorageType

    unpickler, kind = RecordingUnpickler(io.BytesIO(b"")), StorageType("float32")
    assert unpickler.persistent_load(("storage", kind, 7, "cpu", 4)) == Storage("7", kind)
    for pid in ("storage", ("storage", "float32", "7", "cpu", 4), ("module", kind, "7", "cpu", 4),
                ("storage", kind, "7", "cpu")):
        with pytest.raises(pickle.UnpicklingError, match="^unexpected persistent id"):
            unpickler.persistent_load(pid)


def test_zip64_structures_are_walked(llama_bin, tmp_path, monkeypatch):
    path = zip64_copy(llama_bin / "pytorch_model.bin", tmp_path / "z.bin", monkeypatch)
    raw = path.read_bytes()
    assert b"PK\x06\x06" in raw and b"PK\x06\x07" in raw  # zip64 end record and locator
    spans, size = storage_spans(path), len(raw)
    assert not torch_zip_extent(lambda offset, n: raw[offset:offset + n], size, path)
    longer = raw + bytes(3)
    problem = torch_zip_extent(lambda offset, n: longer[offset:offset + n], size + 3, path)
    assert "followed by 3 bytes" in str(problem)
    assert_sizes(str(problem), size + 3, size)
    keep = spans[5][1] + 1
    problem = torch_zip_extent(lambda offset, n: raw[offset:offset + n][:max(0, keep - offset)], keep, path)
    assert f"(first missing tensor: {spans[5][0]})" in str(problem)


# the hub ----------------------------------------------------------------------------------------

def test_gguf_of_an_unknown_version_is_refused_in_the_readers_words(hub, db, tmp_path):  # noqa: F811
    """A GGUF header the gguf package cannot parse (version 99), from a folder and from the hub: one line with the
    reader's first line of reason."""
    path = tmp_path / "v99" / "tiny.gguf"
    path.parent.mkdir()
    write_gguf(path)
    raw = bytearray(path.read_bytes())
    raw[4:8] = struct.pack("<I", 99)
    path.write_bytes(raw)
    hub.repos["org/v99"] = {"tiny.gguf": bytes(raw)}
    reason = "Sorry, file appears to be version 99 which we cannot handle"
    for source, label in ((path, re.escape(str(path))), ("org/v99/tiny.gguf", r"org/v99/tiny\.gguf")):
        refused(db, source, rf"^Error: corrupt or truncated GGUF file {label}: {reason}$")


def test_hub_truncated_safetensors(hub, llama, db):  # noqa: F811
    path = llama / "model.safetensors"
    spans, size = safetensors_spans(path), path.stat().st_size
    keep = size // 2
    path.write_bytes(path.read_bytes()[:keep])
    serve(hub, "org/tiny", llama)
    line = refused(db, "org/tiny", r"^Error: cannot read org/tiny/model\.safetensors: it is .* the download is "
                                   rf"incomplete \(first missing tensor: {re.escape(first_cut(spans, keep))}\)")
    assert_sizes(line, keep, size)
    plan = api.plan("org/tiny")
    assert plan["heads"].to_list() == [8] and plan["warning"][0].startswith("org/tiny/model.safetensors is ")


def test_hub_truncated_gguf_and_its_plan(hub, db, tmp_path):  # noqa: F811
    path = gguf_with_odd_last_tensor(tmp_path / "m.gguf")
    spans = tensor_spans_gguf(path)
    keep = spans[3][1] + 1
    hub.repos["org/g"] = {"m.gguf": path.read_bytes()[:keep]}
    line = refused(db, "org/g/m.gguf", r"^Error: cannot read org/g/m\.gguf: it is .* the download is incomplete "
                                       rf"\(first missing tensor: {re.escape(spans[3][0])}\); download it again$")
    assert_sizes(line, keep, spans[-1][2])
    plan = api.plan("org/g/m.gguf")
    assert plan["heads"].to_list() == [8] and plan["warning"][0] == line.removeprefix("Error: cannot read ").replace(
        ": it is ", " is ", 1)


def test_hub_gguf_cut_inside_its_header(hub, db, tmp_path):  # noqa: F811
    hub.repos["org/smol"] = {"smol.gguf": cut_file(SMOL, tmp_path / "smol.gguf", 1_000_000).read_bytes()}
    refused(db, "org/smol/smol.gguf", r"^Error: cannot read org/smol/smol\.gguf: it is 1\.00 MB and ends inside its "
                                      r"GGUF header \(metadata and tensor table\): the download is incomplete")


def test_hub_truncated_bin(hub, llama_bin, db):  # noqa: F811
    path = llama_bin / "pytorch_model.bin"
    spans = storage_spans(path)
    keep = spans[3][1] + 1
    path.write_bytes(path.read_bytes()[:keep])
    serve(hub, "org/bin", llama_bin)
    refused(db, "org/bin", rf"^Error: cannot read org/bin/pytorch_model\.bin: it is .* the download is incomplete "
                           rf"\(first missing tensor: {re.escape(spans[3][0])}\)")


# foreign formats --------------------------------------------------------------------------------

def ct2_model_bin(spec: str = "WhisperSpec") -> bytes:
    """The start of a CTranslate2 model.bin: uint32 binary version, the spec's name (uint16 length with its NUL),
    uint32 revision, uint32 variable count."""
    name = spec.encode() + b"\0"
    return struct.pack("<IH", 6, len(name)) + name + struct.pack("<II", 3, 0)


def _ctranslate2(folder: Path, llama: Path) -> Path:
    (folder / "model.bin").write_bytes(ct2_model_bin() + bytes(64))
    (folder / "config.json").write_text(json.dumps({"alignment_heads": [[2, 2]], "lang_ids": [1], "suppress_ids": []}))
    (folder / "vocabulary.json").write_text("[]")
    return folder


def _onnx_file(folder: Path, llama: Path) -> Path:
    (folder / "model.onnx").write_bytes(b"\x08\x07\x12\x07pytorch\x1a\x052.1.0" + bytes(32))
    return folder / "model.onnx"


def _onnx_folder(folder: Path, llama: Path) -> Path:  # an Optimum export: config.json beside onnx/model.onnx
    shutil.copy(llama / "config.json", folder)
    (folder / "onnx").mkdir()
    _onnx_file(folder / "onnx", llama)
    return folder


def _mlx_npz(folder: Path, llama: Path) -> Path:
    shutil.copy(llama / "config.json", folder)
    np.savez(folder / "weights.npz", **{"layers.0.attention.wq.weight": np.zeros((32, 32), np.float32)})
    return folder


def _mlx_quantized(folder: Path, llama: Path) -> Path:
    """mlx_lm's 4-bit layout: uint32 packed weights with .scales and .biases, and `quantization` in config.json."""
    config = json.loads((llama / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | {"quantization": {"group_size": 32, "bits": 4}}))
    save_file({f"model.layers.{i}.self_attn.{p}_proj.{part}": np.zeros((32, 4 if part == "weight" else 1), dtype)
               for i in range(2) for p in "qk" for part, dtype in
               (("weight", np.uint32), ("scales", np.float16), ("biases", np.float16))},
              str(folder / "model.safetensors"), metadata={"format": "mlx"})
    return folder


def _ggml_whisper_cpp(folder: Path, llama: Path) -> Path:
    (folder / "ggml-tiny.en.bin").write_bytes(struct.pack("<I", 0x67676D6C) + struct.pack("<11i", *range(11)))
    return folder / "ggml-tiny.en.bin"


def _ggjt_named_gguf(folder: Path, llama: Path) -> Path:  # an early llama.cpp file, renamed
    (folder / "llama-7b.q4_0.gguf").write_bytes(struct.pack("<II", 0x67676A74, 3) + bytes(64))
    return folder / "llama-7b.q4_0.gguf"


def _tensorflow_h5(folder: Path, llama: Path) -> Path:
    shutil.copy(llama / "config.json", folder)
    (folder / "tf_model.h5").write_bytes(b"\x89HDF\r\n\x1a\n" + bytes(64))
    return folder


def _saved_model(folder: Path, llama: Path) -> Path:
    (folder / "saved_model.pb").write_bytes(b"\x08\x01\x12\x9a\x01\n\x0c" + bytes(32))
    (folder / "variables").mkdir()
    return folder


def _flax(folder: Path, llama: Path) -> Path:
    shutil.copy(llama / "config.json", folder)
    (folder / "flax_model.msgpack").write_bytes(b"\x81\xa6params\x80")
    return folder


def _gptq_tensors(folder: Path, llama: Path) -> Path:
    """GPTQ's packed tensors, with no quantization_config to say so."""
    shutil.copy(llama / "config.json", folder)
    save_file({f"model.layers.{i}.self_attn.{p}_proj.{part}": np.zeros((4, 32), np.int32)
               for i in range(2) for p in "qk" for part in ("qweight", "qzeros", "scales", "g_idx")},
              str(folder / "model.safetensors"))
    return folder


def _awq_tensors(folder: Path, llama: Path) -> Path:
    """AWQ's packed tensors (no g_idx), with no quantization_config to say so."""
    shutil.copy(llama / "config.json", folder)
    save_file({f"model.layers.{i}.self_attn.{p}_proj.{part}": np.zeros((4, 32), np.int32)
               for i in range(2) for p in "qk" for part in ("qweight", "qzeros", "scales")},
              str(folder / "model.safetensors"))
    return folder


FOREIGN_CASES = {  # name -> (make(empty folder, llama folder) -> source, format named)
    "CTranslate2 whisper folder": (_ctranslate2, "CTranslate2"),
    "ONNX file": (_onnx_file, "ONNX"),
    "ONNX export folder": (_onnx_folder, "ONNX"),
    "MLX weights.npz": (_mlx_npz, "MLX"),
    "MLX 4-bit safetensors": (_mlx_quantized, "MLX"),
    "whisper.cpp ggml file": (_ggml_whisper_cpp, "GGML"),
    "ggjt file named .gguf": (_ggjt_named_gguf, "GGML"),
    "TensorFlow tf_model.h5": (_tensorflow_h5, "TensorFlow"),
    "TensorFlow SavedModel": (_saved_model, "TensorFlow"),
    "Flax msgpack": (_flax, "Flax"),
    "GPTQ by tensors": (_gptq_tensors, "GPTQ-quantized"),
    "AWQ by tensors": (_awq_tensors, "AWQ-quantized"),
}


def test_every_format_of_the_table_has_a_case():
    assert {form.name.split()[0] for form in FOREIGN} == {name.split()[0] for _, name in FOREIGN_CASES.values()}


@pytest.mark.parametrize("case", FOREIGN_CASES)
def test_foreign_format_is_named(case, db, llama, tmp_path):
    make, name = FOREIGN_CASES[case]
    (tmp_path / "m").mkdir()
    source = make(tmp_path / "m", llama)
    form = next(f for f in FOREIGN if f.name.startswith(name))
    refused(db, source, rf"^Error: {re.escape(str(source))} is an? {re.escape(form.name)} model, which headforms "
                        rf"does not read: give {re.escape(form.instead)}$")


def test_other_formats_beside_the_weights_are_ignored(llama):
    """Hub repos often hold tf_model.h5, flax_model.msgpack and an onnx/ export next to model.safetensors."""
    whole = api.plan(str(llama))
    (llama / "tf_model.h5").write_bytes(b"\x89HDF\r\n\x1a\n" + bytes(64))
    (llama / "flax_model.msgpack").write_bytes(b"\x81\xa6params\x80")
    (llama / "onnx").mkdir()
    _onnx_file(llama / "onnx", llama)
    assert api.plan(str(llama)).drop("source").equals(whole.drop("source"))


def test_a_name_without_its_format_is_not_named(db, llama_bin, tmp_path):
    """A torch zip called model.bin is no CTranslate2 model, one called x.bin no GGML file: they are refused as
    what they are (no Hugging Face weights; not a model folder or GGUF file)."""
    folder = tmp_path / "m"
    folder.mkdir()
    shutil.copy(llama_bin / "config.json", folder)
    shutil.copy(llama_bin / "pytorch_model.bin", folder / "model.bin")
    refused(db, folder, r"^Error: no weights in .*: expected one of model\.safetensors")
    refused(db, folder / "model.bin", r"^Error: cannot read .*model\.bin: give a model folder")


def test_ctranslate2_magic_is_its_header():
    """The CTranslate2 row matches model.bin files CTranslate2 writes, not a torch zip or a GGML file."""
    ct2 = next(f for f in FOREIGN if f.name == "CTranslate2")
    specs = ("WhisperSpec", "TransformerSpec", "TransformerDecoderModelSpec")
    assert all(ct2.magic.match(ct2_model_bin(spec)) for spec in specs)
    assert not ct2.magic.match(b"PK\x03\x04" + bytes(60)) and not ct2.magic.match(b"lmgg" + bytes(60))


def test_foreign_file_through_the_python_api(tmp_path, llama):
    source = _onnx_file(tmp_path, llama)
    with pytest.raises(ExtractError, match="is an ONNX model, which headforms does not read"):
        api.plan(str(source))
