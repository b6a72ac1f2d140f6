"""Quantized Hugging Face checkpoints: which stored tensors make each Q/K weight, and their exact dequantization.

A weight W (out, in) is stored as values q and scales s (with zero points z for asymmetric integer formats), each
scale covering a block of `rows x cols` elements (a whole tensor, a row, a group of a row's columns, a 128 x 128
block; partial blocks at the edges) or, with act-order, the group `g_idx` gives each input column:
W[r, c] = (q[r, c] - z[r // rows, g(c)]) * s[r // rows, g(c)], in float64. FORMATS is the table of the formats read
(their tensor names, packing and zero convention); REFUSED names those whose weights cannot be rebuilt from what the
checkpoint carries. A weight stored dense (a module the config leaves unquantized, or a bf16 checkpoint quantized
only on load) is read as it is.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import numpy as np

from headforms.extract.checkpoint import ExtractError

FLOAT8 = frozenset({"float8_e4m3fn", "float8_e5m2"})
INTEGER = frozenset({"int32", "int8", "uint8"})
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # AWQ's GEMM packing: the k-th nibble of a word is column AWQ_ORDER[k]

REFUSED = {
    "bitsandbytes": "bitsandbytes weights (nf4/fp4 4-bit, LLM.int8) are not read",
    "aqlm": "AQLM stores Q/K as codebook indices, and the codebooks' product is not read",
    "vptq": "VPTQ stores Q/K as vector-codebook indices, which are not read",
    "higgs": "HIGGS stores Q/K as lattice-codebook indices, which are not read",
    "hqq": "HQQ's packed layout is not read",
    "eetq": "EETQ quantizes on load: its weights are the kernel's, not a published layout",
    "quanto": "quanto's weights are not read",
    "torchao": "torchao saves tensor subclasses, which are not read",
    "mxfp4": "MXFP4's e8m0-scaled fp4 blocks are not read",
    "bitnet": "BitNet's ternary packing is not read",
}
_INSTEAD = "give the unquantized model it was made from (its model card names the base model)"


@dataclass(frozen=True)
class Format:
    """How one format stores a weight: tensor-name suffixes per role, where values are packed, the zero convention."""

    values: str                     # suffix of the values (replacing 'weight')
    scale: str                      # suffix of the scales
    zero: str | None = None         # suffix of the zero points (asymmetric integer formats)
    g_idx: str | None = None        # suffix of act-order's column -> group map
    packed: str | None = None       # None (one value per element), 'gptq', 'awq' or 'compressed'
    zero_plus: int = 0              # GPTQ v1 stores each zero point less one
    dtypes: frozenset = FLOAT8      # the values' stored dtypes (any other: the weight is dense)


FORMATS = {
    "fp8": Format("weight", "weight_scale_inv"),                     # DeepSeek-V3, Kimi-K2, Qwen3-FP8
    "fbgemm_fp8": Format("weight", "weight_scale"),                  # per output channel
    "float-quantized": Format("weight", "weight_scale", "weight_zero_point", "weight_g_idx"),
    "naive-quantized": Format("weight", "weight_scale", "weight_zero_point", "weight_g_idx", dtypes=INTEGER),
    "int-quantized": Format("weight", "weight_scale", "weight_zero_point", "weight_g_idx", dtypes=INTEGER),
    "pack-quantized": Format("weight_packed", "weight_scale", "weight_zero_point", "weight_g_idx", packed="compressed",
                             dtypes=INTEGER),
    "gptq": Format("qweight", "scales", "qzeros", "g_idx", packed="gptq", zero_plus=1, dtypes=INTEGER),
    "gptq_v2": Format("qweight", "scales", "qzeros", "g_idx", packed="gptq", dtypes=INTEGER),
    "awq": Format("qweight", "scales", "qzeros", packed="awq", dtypes=INTEGER),
}


@dataclass(frozen=True)
class Scheme:
    """One quantization scheme of a checkpoint: its format, bits and the block each scale covers."""

    method: str
    format: str
    bits: int
    block: tuple[int | None, int | None]  # rows x cols per scale; None: the whole dimension
    symmetric: bool = True
    act_order: bool = False

    def describe(self) -> str:
        """The scheme in words, as models.quantization records it: method, bits, group or block size."""
        rows, cols = self.block
        size = ("per tensor" if rows is None and cols is None else "per channel" if rows == 1 and cols is None
                else f"group {cols}" if rows == 1 else f"{rows}x{cols} blocks")
        method = self.method if self.format in (self.method, "gptq_v2") else f"{self.method} {self.format}"
        kind = "float" if FORMATS[self.format].dtypes == FLOAT8 else "int"
        return (f"{method}, {self.bits}-bit {kind}, {size}" + (", act-order" if self.act_order else "")
                + ("" if self.symmetric else ", asymmetric"))


@dataclass(frozen=True)
class Stored:
    """The stored tensors of one quantized weight, and how they make it."""

    weight: str
    shape: tuple[int, int]
    scheme: Scheme
    names: dict[str, str] = field(default_factory=dict)  # role ('values', 'scale', 'zero', 'g_idx') -> tensor

    def dequantize(self, arrays: dict[str, np.ndarray]) -> np.ndarray:
        """W (out, in) in float64 from the stored tensors (as read: float64 arrays, integers exact)."""
        got = {role: arrays[name] for role, name in self.names.items()}
        form, bits, (out, inp) = FORMATS[self.scheme.format], self.scheme.bits, self.shape
        rows, cols = (self.scheme.block[0] or out), (self.scheme.block[1] or inp)
        groups = (-(-out // rows), -(-inp // cols))
        q, scale, zero = _values(got["values"], form, bits, self.shape), got["scale"], got.get("zero")
        if form.packed in ("gptq", "awq"):  # stored (in, out): scales and zeros per (group, output)
            scale = scale.T
            zero = None if zero is None else _unpack(zero, bits, 1, form.packed == "awq").T + form.zero_plus
        elif zero is not None and form.packed == "compressed":
            zero = _unpack(zero, bits, 0)[:groups[0]]
        scale = scale.reshape(groups)
        index = np.ix_(np.arange(out) // rows, self._columns(got.get("g_idx"), inp, cols, groups[1]))
        if zero is not None:
            q = q - zero.reshape(groups)[index]
        elif form.packed == "compressed":  # values stored as q + 2^(bits-1)
            q = q - (1 << (bits - 1))
        return q * scale[index]

    def _columns(self, g_idx: np.ndarray | None, inp: int, cols: int, groups: int) -> np.ndarray:
        """Each input column's scale column: its block, or the group act-order's g_idx gives it."""
        if g_idx is None:
            return np.arange(inp) // cols
        g = g_idx.astype(np.int64)
        if g.min(initial=0) < 0 or g.max(initial=0) >= groups:
            raise ExtractError(f"tensor '{self.names['g_idx']}' names groups {g.min()}..{g.max()} but "
                               f"'{self.names['scale']}' has {groups}: the checkpoint is damaged")
        return g


def _values(raw: np.ndarray, form: Format, bits: int, shape: tuple[int, int]) -> np.ndarray:
    """The quantized values q (out, in) as float64: fp8 and int8 as read, packed words unpacked."""
    out, inp = shape
    if form.packed == "gptq":
        return _unpack(raw, bits, 0)[:inp].T
    if form.packed == "awq":
        return _unpack(raw, bits, 1, awq=True)[:, :out].T
    if form.packed == "compressed":
        return _unpack(raw, bits, 1)[:, :inp]
    return raw


def _unpack(words: np.ndarray, bits: int, axis: int, awq: bool = False) -> np.ndarray:
    """int32 words (as float64) unpacked along `axis`: value k of a word sits at bits k*bits.. (little end first);
    AWQ's columns are interleaved (AWQ_ORDER)."""
    per = 32 // bits
    w = words.astype(np.int64) & 0xFFFFFFFF
    shifts = np.arange(per) * bits
    if axis == 0:
        v = (w[:, None, :] >> shifts[None, :, None]) & ((1 << bits) - 1)
        return v.reshape(-1, w.shape[1]).astype(np.float64)
    v = (w[:, :, None] >> shifts) & ((1 << bits) - 1)
    if awq:
        v = v[:, :, np.argsort(AWQ_ORDER)]
    return v.reshape(w.shape[0], -1).astype(np.float64)


def refusal(config: dict) -> str | None:
    """Why a quantized config.json cannot be read, if it cannot (in one line, with what to give instead)."""
    try:
        schemes(config)
    except ExtractError as e:
        return str(e)
    return None


def schemes(config: dict) -> list[tuple[list[str], Scheme]] | None:
    """(module targets, Scheme) of a config's quantization_config (targets [] : every module); None if unquantized."""
    quant = config.get("quantization_config")
    if not quant:
        return None
    if not isinstance(quant, dict):
        raise ExtractError("its quantization_config is not a JSON object")
    method = str(quant.get("quant_method", "unknown")).lower()
    if method in REFUSED:
        raise ExtractError(f"quantized checkpoints ({method}): {REFUSED[method]}; {_INSTEAD}")
    if method == "fp8":
        block = quant.get("weight_block_size")
        if block is not None and not (isinstance(block, list) and len(block) == 2
                                      and all(isinstance(b, int) and b > 0 for b in block)):
            raise ExtractError(f"quantization_config.weight_block_size {block} is not two positive sizes")
        return [([], Scheme("fp8", "fp8", 8, tuple(block) if block else (None, None)))]
    if method == "fbgemm_fp8":
        return [([], Scheme(method, method, 8, (1, None)))]
    if method in ("gptq", "awq"):
        return [([], _integer(method, quant))]
    if method == "compressed-tensors":
        return _compressed(quant)
    raise ExtractError(f"quantized checkpoints ({method}) are not read (read: fp8, fbgemm_fp8, compressed-tensors, "
                       f"gptq, awq); {_INSTEAD}")


def _integer(method: str, quant: dict) -> Scheme:
    """A GPTQ or AWQ scheme: bits 2, 4 or 8 (AWQ: 4), a group size that tiles the rows (-1: one group)."""
    bits, group = quant.get("bits", quant.get("w_bit")), quant.get("group_size", quant.get("q_group_size", -1))
    if bits is None:
        raise ExtractError(f"quantized checkpoints ({method}): its quantization_config names no bits")
    fmt = method
    if method == "gptq":
        kind = str(quant.get("checkpoint_format", quant.get("format", "gptq"))).lower()
        if kind not in ("gptq", "gptq_v2"):
            raise ExtractError(f"quantized checkpoints (gptq, {kind} format): the {kind} kernel's permuted layout is "
                               f"not read; give its gptq-format upload, or {_INSTEAD}")
        fmt = kind
    elif str(quant.get("version", "gemm")).lower() != "gemm":
        raise ExtractError(f"quantized checkpoints (awq, {quant.get('version')} version): only AWQ's GEMM packing is "
                           f"read; {_INSTEAD}")
    if bits not in ((4,) if method == "awq" else (2, 4, 8)):
        raise ExtractError(f"quantized checkpoints ({method}, {bits}-bit) are not read: {method} is read at "
                           f"{'4' if method == 'awq' else '2, 4 or 8'} bits; {_INSTEAD}")
    if not isinstance(group, int) or (group <= 0 and group != -1):
        raise ExtractError(f"quantization_config.group_size {group} is not a positive size or -1")
    return Scheme(method, fmt, bits, (1, None if group == -1 else group),
                  symmetric=bool(quant.get("sym", not quant.get("zero_point", False))),
                  act_order=bool(quant.get("desc_act", False)))


def _compressed(quant: dict) -> list[tuple[list[str], Scheme]]:
    """compressed-tensors' config_groups: each group's targets and weight scheme."""
    out = []
    for group in (quant.get("config_groups") or {}).values():
        weights = group.get("weights") if isinstance(group, dict) else None
        if not weights:
            continue
        fmt = str(group.get("format") or quant.get("format") or "")
        if fmt not in FORMATS or FORMATS[fmt].values == "qweight" or fmt in ("fp8", "fbgemm_fp8"):
            raise ExtractError(f"quantized checkpoints (compressed-tensors, {fmt or 'no'} format) are not read "
                               f"(read: float-quantized, naive-quantized, int-quantized, pack-quantized); {_INSTEAD}")
        bits, strategy = weights.get("num_bits"), weights.get("strategy")
        group_size, block = weights.get("group_size"), weights.get("block_structure")
        blocks = {"tensor": (None, None), "channel": (1, None),
                  "group": (1, group_size), "block": tuple(block) if isinstance(block, list) else None}
        if strategy not in blocks or blocks[strategy] is None or (strategy == "group" and not group_size):
            raise ExtractError(f"quantized checkpoints (compressed-tensors, {strategy} strategy) are not read "
                               f"(read: tensor, channel, group, block); {_INSTEAD}")
        if fmt == "pack-quantized" and bits not in (2, 4, 8):
            raise ExtractError(f"quantized checkpoints (compressed-tensors pack-quantized, {bits}-bit) are not read: "
                               f"2, 4 or 8 bits are; {_INSTEAD}")
        out.append((list(group.get("targets") or []),
                    Scheme("compressed-tensors", fmt, int(bits), blocks[strategy],
                           symmetric=bool(weights.get("symmetric", True)),
                           act_order=weights.get("actorder") not in (None, False))))
    if not out:
        raise ExtractError(f"quantized checkpoints (compressed-tensors) without weight schemes are not read; {_INSTEAD}")
    return out


def _targets(targets: list[str], module: str) -> bool:
    """Whether a compressed-tensors target list names a module: 'Linear', 're:<regex>', or its name."""
    return not targets or any(t == "Linear" or (t.startswith("re:") and re.match(t[3:], module))
                              or module == t or module.endswith("." + t) for t in targets)


def candidates(config: dict, names) -> list[str]:
    """Every stored tensor a quantized reading of `names` might need (to read the headers of the shards holding them)."""
    if not schemes(config):
        return []
    roles = {s for form in FORMATS.values() for s in (form.values, form.scale, form.zero, form.g_idx) if s}
    return [n[:-len("weight")] + s for n in names if n.endswith("weight") for s in roles]


def stored(config: dict, wanted: dict[str, tuple[int, ...]], meta: dict) -> dict[str, Stored]:
    """Weight name -> Stored for each wanted (name -> shape) weight the checkpoint holds quantized; each scale,
    zero point and packed tensor checked against the weight's shape, so a bad checkpoint is one line naming it."""
    found = schemes(config)
    if not found:
        return {}
    out = {}
    for weight, shape in wanted.items():
        if not weight.endswith("weight") or len(shape) != 2:
            continue
        base = weight[:-len("weight")]
        scheme = next((s for targets, s in found if _targets(targets, base[:-1])), None)
        form = FORMATS[scheme.format] if scheme else None
        if form is None or meta.get(base + form.values, (None, None))[1] not in form.dtypes:
            continue  # stored dense: read as it is
        names = {role: base + suffix for role, suffix in (("values", form.values), ("scale", form.scale),
                                                           ("zero", form.zero), ("g_idx", form.g_idx))
                 if suffix and base + suffix in meta}
        if "scale" not in names:
            raise ExtractError(f"tensor '{base + form.values}' is quantized ({scheme.describe()}) but its scale "
                               f"'{base + form.scale}' is not in the checkpoint")
        if form.packed in ("gptq", "awq") and "zero" not in names:
            raise ExtractError(f"tensor '{base + form.values}' is {scheme.method}-quantized but its zero points "
                               f"'{base + form.zero}' are not in the checkpoint")
        _check_shapes(scheme, form, names, shape, meta)
        out[weight] = Stored(weight, tuple(shape), scheme, names)
    return out


def _check_shapes(scheme: Scheme, form: Format, names: dict, shape: tuple[int, int], meta: dict) -> None:
    """Each stored tensor has the shape the weight's (out, in) and the scheme imply; else one line naming it."""
    out, inp = shape
    rows, cols = scheme.block
    if cols is not None and form.packed in ("gptq", "awq", "compressed") and inp % cols:
        raise ExtractError(f"tensor '{names['values']}': group size {cols} does not tile its {inp} input columns "
                           f"(quantization_config's group size and the weight disagree)")
    groups = (-(-out // rows) if rows else 1, -(-inp // cols) if cols else 1)
    per = 32 // scheme.bits
    expect = {"values": shape, "scale": groups, "g_idx": (inp,)}
    if form.packed == "gptq":
        expect |= {"values": (inp // per, out), "scale": (groups[1], out), "zero": (groups[1], out // per)}
    elif form.packed == "awq":
        expect |= {"values": (inp, out // per), "scale": (groups[1], out), "zero": (groups[1], out // per)}
    elif form.packed == "compressed":
        expect |= {"values": (out, -(-inp // per)), "zero": (-(-groups[0] // per), groups[1])}
    else:
        expect["zero"] = groups
    for role, name in names.items():
        actual, want = tuple(meta[name][0]), expect[role]
        if role in ("scale", "zero") and form.packed is None and _squeezed(actual) == _squeezed(want):
            continue  # a per-tensor scale stored as () or (1,), a per-channel one as (out,) or (out, 1)
        if actual != want:
            what = {"values": "values", "scale": "scales", "zero": "zero points", "g_idx": "act-order groups"}[role]
            raise ExtractError(f"tensor '{name}' has shape {actual}, but the {what} of '{names['values']}' "
                               f"({out} x {inp} weight, {scheme.describe()}) need {want}")


def _squeezed(shape) -> tuple[int, ...]:
    return tuple(d for d in shape if d != 1)
