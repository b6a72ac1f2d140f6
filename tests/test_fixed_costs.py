"""Fixed costs: safetensors decoded by numpy exactly as torch decodes them, and no torch on the CPU path."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from headforms.extract.formats import hf
from headforms.extract.formats.hf import _safetensors_fetch, _safetensors_spans
from tests import tiny_models as tm
from tests.test_robustness import ROOT

# Values every dtype must carry exactly: zeros of both signs, subnormals, the extremes, infinities, NaN.
SPECIAL = [0.0, -0.0, 1.0, -2.5, 1e-40, -1e-42, 6e-8, 65504.0, 3.0e38, float("inf"), float("-inf"), float("nan")]


@pytest.mark.parametrize("block", [hf.BF16_BLOCK, 1000])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_numpy_decoding_equals_torch(dtype, block, tmp_path, monkeypatch):
    """Every bit pattern class of each safetensors float dtype decodes to torch's float64 value (bfloat16 in
    blocks: the default, and blocks that cut the 65,536 patterns with a short last one)."""
    monkeypatch.setattr(hf, "BF16_BLOCK", block)
    gen = torch.Generator().manual_seed(0)
    tensors = {"random": (torch.randn(33, 17, generator=gen, dtype=torch.float64) * 100).to(dtype),
               "special": torch.tensor(SPECIAL, dtype=torch.float64).to(dtype),
               "all_bits": torch.arange(1 << 16, dtype=torch.int32).to(torch.int16).view(dtype)
               if dtype in (torch.float16, torch.bfloat16) else torch.zeros(0, dtype=dtype),
               "scalar": torch.tensor(7.25, dtype=dtype)}
    path = tmp_path / "t.safetensors"
    save_file(tensors, str(path))
    ours = _safetensors_fetch(path, list(tensors), _safetensors_spans(path))
    for name, tensor in tensors.items():
        expected = tensor.to(torch.float64).numpy()
        assert ours[name].dtype == np.float64 and ours[name].shape == expected.shape, name
        np.testing.assert_array_equal(ours[name], expected, err_msg=name)  # NaN equals NaN here, -0.0 == 0.0
        assert (np.signbit(ours[name]) == np.signbit(expected)).all(), name


def test_cpu_extraction_never_imports_torch(tmp_path):
    """extract of a safetensors model on the CPU runs without torch (it costs ~1.8 s to import)."""
    folder = tm.save(tm.build("llama", dtype=torch.bfloat16), tmp_path / "llama")
    code = ("import sys; from headforms import cli\n"
            "try:\n    cli.main(sys.argv[1:], prog_name='headforms')\n"
            "except SystemExit as e:\n    assert not e.code, e.code\n"
            "print('torch' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code, "extract", str(folder), "--db", str(tmp_path / "w.duckdb")],
                            cwd=ROOT, text=True, capture_output=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "False", result.stdout
