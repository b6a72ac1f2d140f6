"""The `--device cuda` path's mathematics, run here on the CPU's torch: it equals the numpy path.

CI has no GPU, so the torch branches (batched QR, spectra, RoPE distance profiles) would otherwise
run only in tests/gpu_check.py. They take any torch device; on the CPU they are the same code."""
import numpy as np
import pytest
import torch

from headforms.compute import analysis, reduction, spectra
from headforms.compute.rotary import Rotation, distance_profiles

H, H_KV, N, n = 6, 2, 40, 8


@pytest.fixture
def weights():
    rng = np.random.default_rng(3)
    return rng.standard_normal((H, n, N)), rng.standard_normal((H_KV, n, N)), np.repeat(np.arange(H_KV), H // H_KV)


@pytest.fixture
def device_path(monkeypatch):
    """Every `on_cpu` check answers no: the device branches run, with torch tensors on the CPU."""
    monkeypatch.setattr(reduction, "on_cpu", lambda device: False)
    monkeypatch.setattr(analysis, "on_cpu", lambda device: False)


def test_factors_equal_up_to_row_signs(weights, device_path):
    """torch's batched QR of the whole layer gives numpy's per-head R up to the sign of each row."""
    wq, wk, kv = weights
    ours = reduction.reduce_factors(wq, wk, kv, device="cpu")
    assert isinstance(ours, torch.Tensor) and ours.shape == (H, 2 * n, 2 * n)
    numpy = np.stack([np.linalg.qr(np.concatenate([wk[kv[h]], wq[h]]).T, mode="r") for h in range(H)])
    signs = np.sign(np.diagonal(ours.numpy(), axis1=1, axis2=2) * np.diagonal(numpy, axis1=1, axis2=2))
    np.testing.assert_allclose(ours.numpy(), signs[..., None] * numpy, atol=1e-10)


def test_spectra_on_torch_equal_numpy(weights):
    wq, wk, kv = weights
    forms = reduction.reduce_forms(wq, wk, kv)
    forms[-1] = 0.0  # a zero head: the nonzero-rows cut and the zero padding
    for torch_part, numpy_part in zip(spectra._spectra_torch(torch.from_numpy(forms)), spectra.batch_spectra(forms)):
        np.testing.assert_allclose(torch_part, numpy_part, atol=1e-10)
    rank_deficient = forms[:, :, :].copy()
    rank_deficient[:, n:, :] = 0.0  # only the first n rows nonzero, as the reduction's l always has
    for torch_part, numpy_part in zip(spectra._spectra_torch(torch.from_numpy(rank_deficient)),
                                      spectra.batch_spectra(rank_deficient)):
        np.testing.assert_allclose(torch_part, numpy_part, atol=1e-10)


def test_spectra_on_torch_of_an_all_zero_batch():
    """A batch of zero forms (no nonzero row): L's spectra are zeros of the numpy path's shapes and dtypes."""
    zeros = np.zeros((3, 2 * n, 2 * n))
    for torch_part, numpy_part in zip(spectra._spectra_torch(torch.from_numpy(zeros)), spectra.batch_spectra(zeros)):
        assert torch_part.shape == numpy_part.shape and torch_part.dtype == numpy_part.dtype
        assert not torch_part.any()


def test_reduce_forms_stays_on_the_device(weights, device_path):
    """reduce_forms on a device returns its torch tensor, with the numpy forms' spectrum of S."""
    wq, wk, kv = weights
    forms = reduction.reduce_forms(wq, wk, kv, device="cpu")
    assert isinstance(forms, torch.Tensor)
    dense = np.stack([wk[kv[h]].T @ wq[h] for h in range(H)])  # L itself, N x N
    expected = np.linalg.eigvalsh((dense + dense.transpose(0, 2, 1)) / 2)[:, ::-1]
    ours = spectra._spectra_torch(forms)[0]
    np.testing.assert_allclose(ours[:, :n], expected[:, :n], atol=1e-10)
    np.testing.assert_allclose(ours[:, n:], expected[:, -n:], atol=1e-10)


@pytest.mark.parametrize("pairing", ["split-half", "interleaved"])
def test_analysis_on_the_device_path_equals_the_cpu_path(weights, device_path, pairing, monkeypatch):
    """A whole layer (statistics, fits, RoPE distance profiles) through the device branches equals the CPU run."""
    wq, wk, kv = weights
    rotation = Rotation.of(pairing, 10000.0 ** (-np.arange(n // 2) / (n // 2)))
    kwargs = dict(layer=1, seed=0, rotation=rotation, deltas=(0, 1, 7, 100))
    on_device = analysis.analyse_layer(wq, wk, kv, device="cpu", **kwargs)
    monkeypatch.undo()
    on_cpu = analysis.analyse_layer(wq, wk, kv, device="cpu", **kwargs)
    for key, value in on_cpu.statistics.items():
        if value.dtype.kind in "fc":
            np.testing.assert_allclose(on_device.statistics[key], value, rtol=1e-9, atol=1e-12, err_msg=key)
        else:
            np.testing.assert_array_equal(on_device.statistics[key], value, err_msg=key)
    for key in on_cpu.distances:
        if on_cpu.distances[key].dtype.kind in "fc":
            np.testing.assert_allclose(on_device.distances[key], on_cpu.distances[key], rtol=1e-9, atol=1e-12)
        else:
            np.testing.assert_array_equal(on_device.distances[key], on_cpu.distances[key])


def test_distance_profiles_take_torch_factors(weights):
    """distance_profiles of torch factors (one batched call) equal those of the same numpy factors."""
    wq, wk, kv = weights
    factors = reduction.reduce_factors(wq, wk, kv)
    rotation = Rotation.of("split-half", 500.0 ** (-np.arange(n // 2) / (n // 2)))
    deltas = np.array([0, 3, 64])
    ours = distance_profiles(torch.from_numpy(factors), n, rotation, deltas)
    expected = distance_profiles(factors, n, rotation, deltas)
    for key, value in expected.items():
        if value.dtype.kind in "fc":
            np.testing.assert_allclose(ours[key], value, rtol=1e-9, atol=1e-12, err_msg=key)
        else:
            np.testing.assert_array_equal(ours[key], value, err_msg=key)


def test_on_cpu_reads_torch_device_names():
    assert reduction.on_cpu("cpu") and reduction.on_cpu("cpu:0")
    assert not reduction.on_cpu("cuda") and not reduction.on_cpu("cuda:1") and not reduction.on_cpu("mps")


@pytest.mark.parametrize("path", ["numpy", "device"])
def test_reduction_computes_in_float64_from_float32_weights(weights, path, monkeypatch):
    """float32 weights (as a checkpoint may hold) are reduced in float64 on both paths: the factors equal those of
    the same values given as float64."""
    if path == "device":
        monkeypatch.setattr(reduction, "on_cpu", lambda device: False)
    wq, wk, kv = (w.astype(np.float32) if w.dtype.kind == "f" else w for w in weights)
    ours = reduction.reduce_factors(wq, wk, kv)
    reference = reduction.reduce_factors(wq.astype(np.float64), wk.astype(np.float64), kv)
    ours, reference = (np.asarray(x) for x in (ours, reference))
    assert ours.dtype == np.float64
    np.testing.assert_array_equal(ours, reference)


def test_spectra_computes_a_device_batch_on_its_device(monkeypatch):
    """spectra() hands a batch on another device (here torch's shape-only 'meta' device) whole to the torch path,
    and returns its results; a CPU tensor goes to the numpy thread pool instead."""
    batch = torch.randn(3, 4, 4, dtype=torch.float64)
    real, seen = spectra._spectra_torch, []
    monkeypatch.setattr(spectra, "_spectra_torch", lambda l: seen.append(l) or real(batch))
    elsewhere = batch.to("meta")
    result = spectra.spectra(elsewhere)
    assert len(seen) == 1 and seen[0] is elsewhere
    expected = spectra.spectra(batch.numpy())
    for name in ("eig_S", "sv_T", "sigma_T", "eig_L", "sv_L"):
        np.testing.assert_allclose(getattr(result, name), getattr(expected, name), rtol=1e-10, atol=1e-12)
    spectra.spectra(batch)
    assert len(seen) == 1


def test_the_layer_is_reduced_on_the_device_asked_for(weights, monkeypatch):
    """analyse_layer passes its device to the reduction (the QR runs there)."""
    wq, wk, kv = weights
    real, devices = analysis.reduce_factors, []
    monkeypatch.setattr(analysis, "reduce_factors",
                        lambda *args, device="cpu": devices.append(device) or real(*args, device="cpu"))
    analysis.analyse_layer(wq, wk, kv, layer=0, seed=0, device="cuda:1")
    assert devices == ["cuda:1"]


def test_the_factors_are_computed_on_the_device_asked_for(weights):
    """Q, K and the key index all go to the device (torch's shape-only 'meta' device here): the R factors come back
    there, one (2n, 2n) float64 per query head; a tensor left on the CPU would not mix with them."""
    wq, wk, kv = weights
    factors = reduction.reduce_factors(wq, wk, kv, device="meta")
    assert factors.device.type == "meta" and factors.shape == (H, 2 * n, 2 * n) and factors.dtype == torch.float64


@pytest.mark.parametrize("device, cuda_devices, float64, said", [
    ("cpu", 0, True, None), ("cpu:0", 0, True, None), ("cuda", 1, True, None), ("cuda:1", 2, True, None),
    ("foo", 2, True, "device foo: not a torch device name (cpu, cuda or cuda:N)"),
    ("mps", 0, True, "device mps: headforms computes in float64 on cpu or cuda, not on mps"),
    ("cuda", 0, False, "device cuda: no cuda device here (torch {version}{build}); the default device, cpu, needs none"),
    ("cuda:0", 0, True, "device cuda:0: no cuda device here (torch {version}{build}); the default device, cpu, needs none"),
    ("cuda:2", 2, True, "device cuda:2: this machine has 2 cuda devices (cuda:0 to cuda:1)"),
    ("cuda:1", 1, True, "device cuda:1: this machine has 1 cuda device (cuda:0)"),
])
def test_device_problem_names_what_this_machine_lacks(device, cuda_devices, float64, said, monkeypatch):
    """Each refusal's words, CUDA's device count standing in for the machine's (the CLI's one line: test_edges)."""
    monkeypatch.setattr(torch.cuda, "device_count", lambda: cuda_devices)
    build = "" if torch.version.cuda else ", built without CUDA"
    expected = said and said.format(version=torch.__version__, build=build)
    assert reduction.device_problem(device, float64=float64) == expected


def test_the_forward_pass_takes_a_device_the_float64_algebra_refuses(monkeypatch):
    """behaviour's float32 forward pass may run on mps where one is present, extraction's float64 algebra may not;
    where none is present, both say so."""
    monkeypatch.setattr(torch.mps, "device_count", lambda: 1)
    assert reduction.device_problem("mps", float64=False) is None
    assert reduction.device_problem("mps:0", float64=False) is None
    assert "float64" in reduction.device_problem("mps")
    monkeypatch.setattr(torch.mps, "device_count", lambda: 0)
    assert reduction.device_problem("mps", float64=False) == (f"device mps: no mps device here (torch "
                                                              f"{torch.__version__}); the default device, cpu, needs none")
    assert reduction.device_problem("meta", float64=False) == (f"device meta: no meta device here (torch "
                                                               f"{torch.__version__}); the default device, cpu, needs none")
