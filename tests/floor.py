"""The floor of an extraction (issue 19): the work no implementation of the tables can avoid, timed on
the same shapes and data as the run it judges.

Single-threaded LAPACK through numpy, one batched call per layer and part, best of REPEATS:
  qr         one QR (R only) per head's N x 2n stack [W_K^T | W_Q^T], or one per key/value group's
             N x (1 + g) n stack, or the QR of each group's W_K^T shared by its heads (its reflectors applied
             to their W_Q^T, then each head's rows below n factored): the cheapest of the three;
  spectra    of each head's reduced form l = [[A, B], [0, 0]] (2n x 2n): eigenvalues of S, singular values
             of T, eigenvalues of A (n x n: l is block triangular) and singular values of [A | B] (n x 2n);
  distances  one symmetric eigenvalue problem S_delta (2n x 2n) per head and RoPE distance, delta = 0 left
             out (S_0 is the S of spectra);
  baseline   the random baseline's reduced forms (Bartlett's factor, compute/baseline.py) and their S's
             eigenvalues;
  copying    with the output-value circuits (--circuits qk,ov): the copying scores' products and n x n
             eigenvalues (copying_floor) and each model's W_E^T W_U (gram_floor); 0 for the QK forms.
The products that form l and l_delta from the R factors are not timed. The seconds are divided by the
cores (full thread use), and the floor adds the start (the interpreter and the extraction path's imports, as a
whole process: EXTRACTION_IMPORTS) and reading the Q/K bytes at a measured throughput.
"""
from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from scipy.linalg import lapack
from threadpoolctl import threadpool_limits

from headforms.warehouse.running.executors import WORKER_IMPORTS

REPEATS = 3
PARTS = ("qr", "spectra", "distances", "baseline", "copying", "up-projections")  # the last: latent attention's
# What `headforms extract` imports: the command line, the writer and what a worker imports (the executors, the
# readers of both checkpoint formats); the API imports them only when a command extracts (the writer's half, DuckDB
# and polars, once a new warehouse's first layers have started). The floor counts all of it as a one-core start.
EXTRACTION_IMPORTS = "import " + ", ".join(("headforms.cli", "headforms.warehouse.running.load", *WORKER_IMPORTS))
GB = 1e9


def cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def best(fn, repeats: int = REPEATS) -> tuple[float, object]:
    """Best wall time of fn() over `repeats` calls, and the last call's result."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return min(times), out


def rotations(n: int, pairing: str, frequencies, deltas) -> np.ndarray:
    """R(delta) as dense n x n matrices (D, n, n): planes (i, i + P) split-half, (2i, 2i + 1) interleaved."""
    freq = np.asarray(frequencies, dtype=np.float64)
    i = np.arange(len(freq))
    first, second = (i, i + len(freq)) if pairing == "split-half" else (2 * i, 2 * i + 1)
    angles = np.outer(np.asarray(deltas, dtype=np.float64), freq)
    R = np.broadcast_to(np.eye(n), (len(angles), n, n)).copy()
    R[:, first, first], R[:, second, second] = np.cos(angles), np.cos(angles)
    R[:, first, second], R[:, second, first] = -np.sin(angles), np.sin(angles)
    return R


def stacks(wq: np.ndarray, wk: np.ndarray, kv_index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[W_K; W_Q] per head (H, 2n, N) and [W_K; W_Q of the group's heads] per key/value group (H_kv, (1 + g) n, N)
    (the heads of a group adjacent, as ModelSpec.kv_index has them)."""
    H, n, N = wq.shape
    q, k = np.asarray(wq, np.float64), np.asarray(wk, np.float64)
    return (np.concatenate([k[np.asarray(kv_index)], q], axis=1),
            np.concatenate([k, q.reshape(len(k), H // len(k) * n, N)], axis=1))


def key_groups(wq: np.ndarray, wk: np.ndarray, kv_index: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """(W_K^T (N, n), [W_Q^T of the group's heads] (N, g n), Fortran order) per key/value group, when every group
    has more than one query head and N >= 2n (else none: the shared-key QR does not apply)."""
    H, n, N = wq.shape
    kv = np.asarray(kv_index)
    if N < 2 * n or np.bincount(kv, minlength=len(wk)).min() < 2:
        return []
    return [(np.asfortranarray(np.asarray(wk[j], np.float64).T),
             np.asfortranarray(np.asarray(wq[kv == j], np.float64).reshape(-1, N).T)) for j in range(len(wk))]


def shared_key_qr(groups: list[tuple[np.ndarray, np.ndarray]], n: int) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per group of `key_groups`: the R of its W_K^T (n, n), Q_K^T W_Q^T's first n rows of each head (g, n, n) and the R
    of each head's rows below them (g, n, n): the blocks of every head's R = [[R_KK, top], [0, R_QQ]]."""
    out = []
    for kt, qt in groups:
        qr_k, tau, _, _ = lapack.dgeqrf(kt)
        lwork = int(lapack.dormqr("L", "T", qr_k, tau, qt, -1)[1][0])
        rotated = lapack.dormqr("L", "T", qr_k, tau, qt, lwork)[0].T.reshape(-1, n, len(kt)).swapaxes(-2, -1)
        out.append((np.triu(qr_k[:n]), rotated[:, :n], np.linalg.qr(rotated[:, n:], mode="r")))
    return out


def form_problems(R: np.ndarray, n: int) -> dict[str, np.ndarray]:
    """The spectral problems of each head's reduced form l = R_K R_Q^T = [[A, B], [0, 0]] from the per-head R factors
    [R_K | R_Q] (H, r, 2n): S and T (eigvalsh, svd), A (eigvals: l is block triangular) and [A | B] (svd)."""
    top = R[:, :n, :n] @ R[:, :, n:].swapaxes(-2, -1)                    # R_K's rows below n are zero
    r = top.shape[-1]
    l = np.zeros((len(R), r, r))
    l[:, :n] = top
    return {"S": (l + l.swapaxes(-2, -1)) / 2, "T": (l - l.swapaxes(-2, -1)) / 2,
            "A": np.ascontiguousarray(top[:, :, :n]), "AB": top}


def distance_problems(R: np.ndarray, n: int, rope, deltas) -> np.ndarray:
    """S_delta (D * H, r, r), delta-major, of l_delta = R_K R(delta) R_Q^T for every head and delta."""
    rot = rotations(n, rope.pairing, rope.frequencies, deltas)           # (D, n, n)
    top = (R[:, :n, :n] @ rot[:, None] @ R[:, :, n:].swapaxes(-2, -1)[None]).reshape(-1, n, R.shape[-2])
    r = top.shape[-1]
    s = np.zeros((len(top), r, r))
    s[:, :n, :n] = (top[:, :, :n] + top[:, :, :n].swapaxes(-2, -1)) / 2
    s[:, :n, n:] = top[:, :, n:] / 2
    s[:, n:, :n] = top[:, :, n:].swapaxes(-2, -1) / 2
    return s


def baseline(H: int, n: int, N: int, layer: int) -> np.ndarray:
    """Eigenvalues of the random baseline's S (H, r): Bartlett's factor of a Gaussian head, as compute/baseline.py."""
    rng = np.random.default_rng([0, layer])
    r = min(N, 2 * n)
    upper = np.triu(rng.standard_normal((H, r, 2 * n)), k=1)
    idx = np.arange(r)
    upper[:, idx, idx] = np.sqrt(rng.chisquare(N - idx, size=(H, r)))
    g = upper[:, :, :n] @ upper[:, :, n:].swapaxes(-2, -1)
    return np.linalg.eigvalsh((g + g.swapaxes(-2, -1)) / 2)


def layer_floor(wq: np.ndarray, wk: np.ndarray, kv_index: np.ndarray, *, rope=None, deltas=(),
                layer: int = 0, repeats: int = REPEATS) -> dict[str, float]:
    """Single-threaded seconds of each of PARTS for one layer (wq (H, n, N), wk (H_kv, n, N)), best of `repeats`.

    rope: an object with .pairing and .frequencies (extract.layouts.rope.Rope), or None; deltas: the RoPE distances."""
    H, n, N = wq.shape
    per_head, per_group = stacks(wq, wk, kv_index)
    out = {}
    with threadpool_limits(limits=1):
        t_head, R = best(lambda: np.linalg.qr(per_head.swapaxes(-2, -1), mode="r"), repeats)
        t_group = best(lambda: np.linalg.qr(per_group.swapaxes(-2, -1), mode="r"), repeats)[0] \
            if len(per_group) < H else t_head
        groups = key_groups(wq, wk, kv_index)
        t_shared = best(lambda: shared_key_qr(groups, n), repeats)[0] if groups else t_head
        out["qr"] = min(t_head, t_group, t_shared)
        p = form_problems(R, n)
        out["spectra"] = best(lambda: (np.linalg.eigvalsh(p["S"]), np.linalg.svd(p["T"], compute_uv=False),
                                       np.linalg.eigvals(p["A"]), np.linalg.svd(p["AB"], compute_uv=False)),
                              repeats)[0]
        moved = [d for d in deltas if d != 0]
        if rope is not None and moved:
            s_d = distance_problems(R, n, rope, moved)
            out["distances"] = best(lambda: np.linalg.eigvalsh(s_d), repeats)[0]
        else:
            out["distances"] = 0.0
        out["baseline"] = best(lambda: baseline(H, n, N, layer), repeats)[0]
    return out


def copying_floor(w_v: np.ndarray, w_o: np.ndarray, kv_index: np.ndarray, gram: np.ndarray | None,
                  repeats: int = REPEATS) -> float:
    """Single-threaded seconds of one layer's copying scores: each key/value group's W_V G (n x N by N x N), each
    head's n x n product with its W_O and the eigenvalues of those and of W_V W_O (the residual score)."""
    v, o, kv = np.asarray(w_v, np.float64), np.asarray(w_o, np.float64), np.asarray(kv_index)
    with threadpool_limits(limits=1):
        seconds = best(lambda: np.linalg.eigvals(v[kv] @ o), repeats)[0]
        if gram is not None:
            seconds += best(lambda: np.linalg.eigvals((v @ gram)[kv] @ o), repeats)[0]
    return seconds


def gram_floor(w_e: np.ndarray, w_u: np.ndarray | None, repeats: int = REPEATS) -> float:
    """Single-threaded seconds of a model's W_E^T W_U (N x vocab by vocab x N), once per model; 0 without W_U."""
    if w_u is None:
        return 0.0
    with threadpool_limits(limits=1):
        return best(lambda: w_e.T @ w_u, repeats)[0]


def parallel_share(wq: np.ndarray, wk: np.ndarray, kv_index: np.ndarray, *, rope=None, deltas=(),
                   repeats: int = REPEATS) -> float:
    """How much of `cores()` times one thread's speed the machine gives when every core runs these calls at once:
    a layer's largest part (its distance problems, else its S problems) single-threaded over one thread per core
    each on its share, best of `repeats`. 1.0 is the ideal the floor divides by; memory and caches shared between
    the cores make it less (information: the floor's targets stay against the ideal)."""
    import threading

    H, n, N = wq.shape
    R = np.linalg.qr(stacks(wq, wk, kv_index)[0].swapaxes(-2, -1), mode="r")
    moved = [d for d in deltas if d != 0]
    problems = distance_problems(R, n, rope, moved) if rope is not None and moved else form_problems(R, n)["S"]
    workers = cores()
    shares = [problems[i::workers] for i in range(workers)]

    def together():
        threads = [threading.Thread(target=np.linalg.eigvalsh, args=(share,)) for share in shares]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    alone, both = [], []
    with threadpool_limits(limits=1):
        for _ in range(repeats):  # alternated, so that a passing load on the host weighs on both alike
            alone.append(best(lambda: np.linalg.eigvalsh(problems), 1)[0])
            both.append(best(together, 1)[0])
    return min(alone) / (workers * min(both))


def add_parts(total: dict[str, float], parts: dict[str, float], times: float = 1.0) -> dict[str, float]:
    """total + times * parts, part by part."""
    return {p: total.get(p, 0.0) + times * parts.get(p, 0.0) for p in PARTS}


def start_seconds(python: Path, repeats: int = REPEATS) -> float:
    """Best wall time of the interpreter importing the extraction path (EXTRACTION_IMPORTS) and exiting as the command
    line does (its heap frozen: cli.run), as a whole process."""
    code = f"{EXTRACTION_IMPORTS}; import gc; gc.freeze()"
    return best(lambda: subprocess.run([str(python), "-c", code], check=True, capture_output=True), repeats)[0]


def read_gbps(spans: list[tuple[Path, int, int]], repeats: int = 1) -> float:
    """GB/s of positioned reads of (file, start, end) spans into one buffer, best of `repeats` (as the files are:
    evict them first for a cold figure)."""
    size = max(end - start for _, start, end in spans)
    buf = bytearray(size)
    view = memoryview(buf)
    total = sum(end - start for _, start, end in spans)

    def read():
        fds = {}
        try:
            for path, start, end in spans:
                fd = fds.get(path) or fds.setdefault(path, os.open(path, os.O_RDONLY))
                done = 0
                while done < end - start:
                    done += os.preadv(fd, [view[done:end - start]], start + done)
        finally:
            for fd in fds.values():
                os.close(fd)

    return total / best(read, repeats)[0] / GB


@dataclass
class Floor:
    """The floor of one whole-process run: LAPACK seconds at one thread over the cores, start, reading."""

    parts: dict[str, float]   # single-threaded seconds of each of PARTS, all layers of all models
    cores: int
    start: float              # the interpreter and the extraction path's imports, whole process
    qk_bytes: int             # Q/K bytes the run must read
    read_gbps: float          # at this throughput
    notes: list[str] = field(default_factory=list)
    share: float | None = None  # parallel_share of the machine on these calls, when measured (information)

    @property
    def compute(self) -> float:
        return sum(self.parts.values()) / self.cores

    @property
    def reading(self) -> float:
        return self.qk_bytes / (self.read_gbps * GB)

    @property
    def total(self) -> float:
        return self.start + self.compute + self.reading

    def describe(self) -> str:
        parts = ", ".join(f"{p} {self.parts.get(p, 0.0):.2f}" for p in PARTS)
        return (f"floor {self.total:.2f} s = start {self.start:.2f} s (interpreter and imports) + linear algebra "
                f"{sum(self.parts.values()):.2f} s at one thread / {self.cores} cores = {self.compute:.2f} s "
                f"({parts} s) + reading {self.qk_bytes / 1e6:.1f} MB of Q/K at {self.read_gbps:.2f} GB/s = "
                f"{self.reading:.2f} s" + "".join(f"\n  {note}" for note in self.notes)
                + (f"\n  all {self.cores} cores at once ran these calls at {self.share:.2f} of {self.cores}x one "
                   f"thread (measured): at this machine's own full use the floor would be "
                   f"{self.start + self.compute / self.share + self.reading:.2f} s (information)"
                   if self.share else ""))
