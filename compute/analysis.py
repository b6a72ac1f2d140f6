"""One layer from Q/K arrays to every number the warehouse stores about its heads."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from headforms.compute.baseline import random_forms
from headforms.compute.fits import fit_families
from headforms.compute.reduction import forms, head_factors, on_cpu, reduce_factors
from headforms.compute.rotary import Rotation, assemble_profiles, later_profiles, profile_problems
from headforms.compute.spectra import Spectra, batch_spectra, later_spectra
from headforms.compute.statistics import PARITY_TOLERANCE, fit_samples, head_statistics, pairing, profile, \
    symmetric_energy, theta
from headforms.compute.threads import Pool, batches

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
    ambient: int | None = None,
) -> LayerAnalysis:
    """Reduce, take spectra, statistics, the random baseline and all fits of one layer.

    On the CPU every library runs single-threaded here; the heads are spread over threads
    instead (compute.threads). With a RoPE `rotation`, also the profiles of L_delta at `deltas`,
    from the same reduction's factors. `ambient`: the width N the maps act on where they are given in an
    orthonormal basis of a smaller span (extract.layouts.latent), for n_zero_ambient and the random baseline."""
    with Pool() as pool:
        return start_layer(pool, wq, wk, kv_index, layer=layer, seed=seed, parity_tolerance=parity_tolerance,
                           device=device, rotation=rotation, deltas=deltas, ambient=ambient)()


def start_layer(pool: Pool, wq: np.ndarray, wk: np.ndarray, kv_index: np.ndarray, *, layer: int, seed: int,
                parity_tolerance: float = PARITY_TOLERANCE, device: str = "cpu", rotation: Rotation | None = None,
                deltas=(0,), ambient: int | None = None) -> Callable[[], LayerAnalysis]:
    """`analyse_layer`, its linear algebra started now on `pool` and the function returned collecting it (the
    statistics and fits run in the caller's thread then). On the CPU each piece is a batch of heads taken from
    its QR through its spectra and distance problems, so a layer's pieces wait on nothing but a free thread,
    and a caller may start the next layer before collecting this one: the threads never wait for a layer's
    last piece. On another device the linear algebra runs there at once."""
    n_heads, head_dim, d_model = wq.shape
    random_later = pool.submit(_random_statistics, seed, layer, n_heads, head_dim, ambient or d_model)
    if on_cpu(device):
        q, k = np.asarray(wq, dtype=np.float64), np.asarray(wk, dtype=np.float64)
        kv = np.asarray(kv_index, dtype=np.intp)
        if rotation is not None:
            deltas = np.asarray(deltas, dtype=np.int64)
        # L_0 = L: delta 0's eigenproblems are the spectra's, and every delta's where no plane rotates (a NoPE layer)
        solve = None if rotation is None else (deltas != 0) & (len(rotation.frequencies) > 0)
        # a piece's forms are r x r, r = min(N, 2n); a key/value group's heads share a piece (and their key's QR)
        parts = batches(n_heads, min(d_model, 2 * head_dim), kv)
        pieces = [pool.submit(_heads, k, kv[part], q[part], head_dim, rotation, deltas, solve) for part in parts]

        def linear_algebra():
            spectra, profiles = zip(*(piece.result() for piece in pieces))
            sp = Spectra.of(*(np.concatenate(x) for x in zip(*spectra)))
            distances = (assemble_profiles(profiles, parts, deltas, solve, sp.eig_S, parity_tolerance)
                         if rotation is not None else None)
            return sp, distances
    else:
        factors = reduce_factors(wq, wk, kv_index, device=device)
        sp_later = later_spectra(pool, forms(factors, head_dim))
        distances_later = (later_profiles(pool, factors, head_dim, rotation, deltas, parity_tolerance=parity_tolerance)
                           if rotation is not None else lambda: None)

        def linear_algebra():
            return sp_later(), distances_later()

    def collect() -> LayerAnalysis:
        sp, distances = linear_algebra()
        stats = head_statistics(sp, ambient or d_model, parity_tolerance)
        samples = fit_samples(sp, head_dim)
        stacked = fit_families(np.concatenate([samples[name] for name in SAMPLES]))
        fits = {
            name: {family: {col: v[i * n_heads:(i + 1) * n_heads] for col, v in cols.items()}
                   for family, cols in stacked.items()}
            for i, name in enumerate(SAMPLES)
        }
        stats.update(random_later.result())
        return LayerAnalysis(statistics=stats, spectra=sp, fits=fits, distances=distances)

    return collect


def _heads(k: np.ndarray, kv: np.ndarray, q: np.ndarray, n: int, rotation: Rotation | None, deltas: np.ndarray,
           solve: np.ndarray | None):
    """One piece of a layer on the CPU: a batch of query heads q (h, n, N), with their key heads k[kv], reduced by
    QR, their spectra, and with RoPE their distance problems (`rotary.profile_problems`)."""
    factors = head_factors(k, kv, q)
    spectra = batch_spectra(forms(factors, n))
    return spectra, profile_problems(factors, n, rotation, deltas, solve) if rotation is not None else None


def _random_statistics(seed: int, layer: int, n_heads: int, head_dim: int, d_model: int) -> dict[str, np.ndarray]:
    """The random baseline's columns of the heads table: symmetric energy, pairing and Theta of Gaussian heads."""
    rand = random_forms(seed, layer, n_heads, head_dim, d_model)
    rand_eig = np.linalg.eigvalsh((rand + rand.transpose(0, 2, 1)) / 2)[:, ::-1]
    rand_norm = np.linalg.norm(rand, axis=(1, 2))
    stats = {"random_symmetric_energy": symmetric_energy(rand_eig, rand_norm), "random_pairing": pairing(rand_eig)}
    stats["random_theta_distance"], stats["random_theta_position"] = theta(profile(rand_eig, rand_norm))
    return stats
