"""One layer from Q/K arrays to every number the warehouse stores about its heads."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from headforms.compute.baseline import random_forms
from headforms.compute.fits import fit_families
from headforms.compute.reduction import forms, on_cpu, reduce_factors
from headforms.compute.rotary import Rotation, later_profiles
from headforms.compute.spectra import Spectra, later_spectra
from headforms.compute.statistics import PARITY_TOLERANCE, fit_samples, head_statistics, pairing, profile, \
    symmetric_energy, theta
from headforms.compute.threads import Pool, single_threaded

SAMPLES = ("L_abs", "S_pos", "S_neg", "T")


@dataclass
class LayerAnalysis:
    """Per-head statistics, spectra and fits of one layer's heads."""

    statistics: dict[str, np.ndarray]             # column -> (H,)
    spectra: Spectra
    fits: dict[str, dict[str, dict[str, np.ndarray]]]  # sample -> family -> column -> (H,)
    distances: dict[str, np.ndarray] | None = None     # RoPE: column -> (D, H) profiles of L_delta


def analyse_layer(
    wq: np.ndarray,
    wk: np.ndarray,
    kv_index: np.ndarray,
    *,
    layer: int,
    seed: int,
    parity_tolerance: float = PARITY_TOLERANCE,
    device: str = "cpu",
    rotation: Rotation | None = None,
    deltas=(0,),
) -> LayerAnalysis:
    """Reduce, take spectra, statistics, the random baseline and all fits of one layer.

    On the CPU every library runs single-threaded here; the heads are spread over threads
    instead (compute.threads). With a RoPE `rotation`, also the profiles of L_delta at `deltas`,
    from the same reduction's factors."""
    args = (wq, wk, kv_index, layer, seed, parity_tolerance, device, rotation, deltas)
    if on_cpu(device):
        with single_threaded():
            return _analyse(*args)
    return _analyse(*args)


def _analyse(wq, wk, kv_index, layer, seed, parity_tolerance, device, rotation, deltas) -> LayerAnalysis:
    """The layer's linear algebra as pieces on one pool, submitted as soon as their inputs exist (the random
    baseline first, needing none; then spectra and distance profiles, from the reduction's factors); the
    statistics and fits of the spectra run in this thread while the other pieces are still being computed."""
    n_heads, head_dim, d_model = wq.shape
    with Pool() as pool:
        random_later = pool.submit(_random_statistics, seed, layer, n_heads, head_dim, d_model)  # beside the QRs
        factors = reduce_factors(wq, wk, kv_index, device=device)
        sp_later = later_spectra(pool, forms(factors, head_dim))
        distances_later = (later_profiles(pool, factors, head_dim, rotation, deltas, parity_tolerance=parity_tolerance,
                                          eig_S0=lambda: sp.eig_S) if rotation is not None else lambda: None)
        sp = sp_later()
        stats = head_statistics(sp, d_model, parity_tolerance)
        samples = fit_samples(sp, head_dim)
        stacked = fit_families(np.concatenate([samples[name] for name in SAMPLES]))
        fits = {
            name: {family: {col: v[i * n_heads:(i + 1) * n_heads] for col, v in cols.items()}
                   for family, cols in stacked.items()}
            for i, name in enumerate(SAMPLES)
        }
        stats.update(random_later.result())
        distances = distances_later()
    return LayerAnalysis(statistics=stats, spectra=sp, fits=fits, distances=distances)


def _random_statistics(seed: int, layer: int, n_heads: int, head_dim: int, d_model: int) -> dict[str, np.ndarray]:
    """The random baseline's columns of the heads table: symmetric energy, pairing and Theta of Gaussian heads."""
    rand = random_forms(seed, layer, n_heads, head_dim, d_model)
    rand_eig = np.linalg.eigvalsh((rand + rand.transpose(0, 2, 1)) / 2)[:, ::-1]
    rand_norm = np.linalg.norm(rand, axis=(1, 2))
    stats = {"random_symmetric_energy": symmetric_energy(rand_eig, rand_norm), "random_pairing": pairing(rand_eig)}
    stats["random_theta_distance"], stats["random_theta_position"] = theta(profile(rand_eig, rand_norm))
    return stats
