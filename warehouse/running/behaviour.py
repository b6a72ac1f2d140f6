"""Each head's behaviour beside its form (statistics.md section 8): rows of `head_behaviour` from a forward
pass and the warehouse's own forms, their layer-bootstrap intervals (`behaviour_intervals`), and storing both.

The form's self-logit is computed from W_Q, W_K read again through the same extract/ reader that built the
model's rows (same source, revision and fold_norm, checked against `models`), never from the transformers
copy of the weights: the model's logit is then reproduced by the warehouse's form plus the bias part (on a model
extracted with qk_norm="fold", times the per-token RMS factors of its q and k norms, taken from the forward pass). A
multi-head latent attention head's form is the sum of its parts' (heads.part 'nope' and 'rope'), each times the
per-token factors of the latents' norms that its factor names (extract.layouts.latent).
"""
from __future__ import annotations

import numpy as np
import polars as pl

from headforms.compute import bootstrap
from headforms.compute.behaviour import query_temperature, self_logit_parts
from headforms.extract.checkpoint import ExtractError
from headforms.warehouse.storing.store import insert, query, transaction

SCORES = ("self_score", "previous_score", "induction_score", "self_logit")
PARITIES = ("I+", "II", "I-")
CONTRAST = "I+ - I-"  # the difference of the I+ and I- medians, resampled together


def stored_targets(con, targets: list) -> list[tuple[object, str]]:
    """Each target of `behaviour` with the qk_norm option its model was extracted with: a warehouse model's name
    given as the source (not a path) becomes that model's stored source and hub revision."""
    from dataclasses import replace
    from pathlib import Path

    models = {row["model"]: row for row in query(
        con, "SELECT model, source, revision, revision_kind, qk_norm FROM models").to_dicts()}
    resolved = []
    for target in targets:
        row = models.get(target.source)
        if row is not None and not Path(target.source).expanduser().exists():
            pinned = row["revision"] if row["revision_kind"] in ("hub", "given") else None
            target = replace(target, source=row["source"], name=target.name or row["model"],
                             revision=target.revision or pinned)
        row = models.get(target.name) if target.name else None
        folded = (row or {}).get("qk_norm") == "folded" or (row is None and any(
            m["source"] == target.source and m["qk_norm"] == "folded" for m in models.values()))
        resolved.append((target, "fold" if folded else "refuse"))
    return resolved


def stored_model(con, ckpt) -> dict:
    """The `models` row of a checkpoint's model, checked to hold this checkpoint's form: same revision, complete,
    no input norm folded into W_Q, W_K (the model's logit reads the attention's input as it is; QK-norm gains folded
    are reproduced with the per-token factors); a model with parts needs behaviour_intervals keyed by part."""
    rows = query(con, "SELECT * FROM models WHERE model = ?", [ckpt.name]).to_dicts()
    if not rows:
        named = query(con, "SELECT model FROM models WHERE source = ? ORDER BY model", [ckpt.source])["model"]
        if named.len():  # extracted under another name (a model set's, or --name)
            raise ExtractError(f"{ckpt.name} is not in the warehouse, but {ckpt.source} is, as {', '.join(named)}: "
                               f"pass name={named[0]!r}" + (" (or another of them)" if named.len() > 1 else ""))
        raise ExtractError(f"{ckpt.name} is not in the warehouse: run `headforms extract {ckpt.source}` on it first")
    model = rows[0]
    if not model["complete"]:
        raise ExtractError(f"{ckpt.name} is incomplete in the warehouse: run `headforms extract {ckpt.source}` "
                           "to finish it first")
    if model["revision"] != ckpt.revision:
        raise ExtractError(f"{ckpt.name} in the warehouse was extracted from revision {model['revision']}, "
                           f"{ckpt.source} is now {ckpt.revision}: extract it again with force=True")
    if ckpt.spec.parts and "part" not in query(
            con, "SELECT constraint_column_names AS key FROM duckdb_constraints() WHERE table_name = "
                 "'behaviour_intervals' AND constraint_type = 'PRIMARY KEY' AND database_name = current_database()"
            )["key"].explode():
        raise ExtractError(f"{ckpt.name} stores each head as its parts ({', '.join(p.name for p in ckpt.spec.parts)}),"
                           " and this warehouse's behaviour_intervals were built before parts (keyed without part): "
                           "run behaviour on a warehouse built since, or rebuild this one")
    if model["fold_norm"]:
        raise ExtractError(f"{ckpt.name} was extracted with fold_norm={model['fold_norm']!r} (the norm feeding "
                           "attention folded into W_Q, W_K): behaviour compares the form on the attention's own input; "
                           "extract it with fold_norm='none' under another name")
    return model


def _capped(score: np.ndarray, cap: float | None) -> np.ndarray:
    """The logit of a soft-capped family, cap * tanh(score / cap); the score itself without a cap."""
    return score if not cap else cap * np.tanh(score / cap)


def behaviour_rows(model: dict, ckpt, run, *, length: int, sequences: int, seed: int, on_layer=None) -> pl.DataFrame:
    """One row per head of `head_behaviour`: the run's scores, the model's mean self-logit, the form's and the
    biases' parts, and the largest |model - form - bias| over positions and sequences (on_layer(i) after layer i)."""
    frames = []
    for layer, taken in zip(ckpt.spec.layers, run.layers):  # a hybrid's attention layers, by their own indices
        form, bias = (_parts_self_logits if ckpt.spec.parts else _whole_self_logits)(model, ckpt, layer, taken)
        heads = len(taken.self_score)
        frames.append(pl.DataFrame({
            "model": ckpt.name, "layer": np.full(heads, layer, np.int32), "head": np.arange(heads, dtype=np.int32),
            "self_score": taken.self_score, "previous_score": taken.previous_score,
            "induction_score": taken.induction_score, "self_logit": taken.logits.mean(axis=(0, 2)),
            "form_self_logit": form.mean(axis=(0, 2)), "bias_self_logit": bias.mean(axis=(0, 2)),
            "reproduction_error": np.abs(taken.logits - _capped(form + bias, model.get("attention_softcap")))
            .max(axis=(0, 2)),
            "length": length, "sequences": sequences, "seed": seed}))
        if on_layer is not None:
            on_layer(layer)
    return pl.concat(frames)


def _whole_self_logits(model: dict, ckpt, layer: int, taken) -> tuple[np.ndarray, np.ndarray]:
    """(B, H, P) twice: a whole head's form part and bias part of its self-logits (compute.behaviour), a folded
    QK-norm's per-token factors applied."""
    w_q, w_k = ckpt.read_layer(layer)
    b_q = np.zeros(w_q.shape[:2]) if taken.b_q is None else taken.b_q
    b_k = np.zeros(w_k.shape[:2]) if taken.b_k is None else taken.b_k
    folded = model["qk_norm"] == "folded"
    q_factor, k_factor = (taken.q_factor, taken.k_factor) if folded else (None, None)
    rope = ckpt.spec.rope
    if rope is not None and layer in rope.nope_layers:  # Llama 4's NoPE layers: no QK-norm; q_i times a temperature
        temperature = ckpt.spec.config.get("attention_temperature")
        q_factor = None if temperature is None else query_temperature(
            taken.inputs.shape[1], temperature["floor_scale"], temperature["attn_scale"])[None, :, None]
    elif folded and (q_factor is None or k_factor is None):
        raise ExtractError(f"{ckpt.name}: extracted with qk_norm='fold', but layer {layer}'s attention has no "
                           "q and k norm behaviour can read the per-token factors of")
    if folded and (np.any(b_q) or np.any(b_k)):  # a bias inside the norm is scaled by a gain the form holds
        raise ExtractError(f"{ckpt.name}: q/k biases under a QK-norm are not reproduced by behaviour")
    return self_logit_parts(taken.inputs, w_q, w_k, b_q, b_k, ckpt.spec.kv_index, model["score_scale"],
                            q_factor, k_factor)


def _parts_self_logits(model: dict, ckpt, layer: int, taken) -> tuple[np.ndarray, np.ndarray]:
    """(B, H, P) twice: a latent head's form part, the sum of its parts' score_scale * x_i^T L x_i each times the
    factors its factor names (1/rms_q(x_i), 1/rms_kv(x_j) at j = i), and a zero bias part (MLA has no q/k biases)."""
    forms = ckpt.read_layer(layer)
    x = taken.inputs if forms.basis is None else taken.inputs @ forms.basis  # the parts' coordinates, U^T x
    factors = {"rms_q": taken.q_factor, "rms_kv": taken.k_factor}
    form = np.zeros_like(taken.logits)
    for part in forms.parts.values():
        named = {name: factor for name, factor in factors.items() if name in part.factor}
        if missing := [name for name, factor in named.items() if factor is None]:
            raise ExtractError(f"{ckpt.name}: the part {part.name} is scored by {part.factor}, but layer {layer}'s "
                               f"attention has no norm behaviour can read {missing[0]} from")
        zeros = np.zeros(part.wq.shape[:2]), np.zeros(part.wk.shape[:2])
        form += self_logit_parts(x, part.wq, part.wk, *zeros, part.kv_index, model["score_scale"],
                                 named.get("rms_q"), named.get("rms_kv"))[0]
    return form, np.zeros_like(form)


def behaviour_intervals(rows: pl.DataFrame, parity: pl.Series, resamples: int, seed: int) -> pl.DataFrame:
    """Rows of `behaviour_intervals`: per parity type and score, the median over the type's heads with its 95%
    interval resampling layers (all heads of a drawn layer, as model_intervals does); and the I+ minus I-
    difference of medians over the same resamples. Heads of undefined parity are in no type."""
    values = rows.select(SCORES).to_numpy().astype(float)
    types = parity.to_numpy()
    layer = rows["layer"].to_numpy()
    groups = np.stack([np.flatnonzero(layer == k) for k in np.unique(layer)])
    masked = np.concatenate([np.where((types == p)[:, None], values, np.nan) for p in PARITIES], axis=1)
    result = bootstrap.intervals(masked, "median", groups, resamples, seed)
    drawn = bootstrap.resample_rows(groups, resamples, np.random.default_rng(seed))  # the same resamples
    plus, minus = (masked[:, i * len(SCORES):(i + 1) * len(SCORES)] for i in (0, 2))
    estimate = bootstrap.median(plus.T) - bootstrap.median(minus.T)
    replicates = np.stack([bootstrap.median(plus[:, f][drawn]) - bootstrap.median(minus[:, f][drawn])
                           for f in range(len(SCORES))])
    low, high = bootstrap.bounds(replicates)  # a type absent from every resample: NaN bounds
    return pl.DataFrame({
        "model": rows["model"][0], "parity": [p for p in (*PARITIES, CONTRAST) for _ in SCORES],
        "figure": [f"median_{s}" for _ in range(len(PARITIES) + 1) for s in SCORES],
        "estimate": np.concatenate([result[:, 0], estimate]), "low": np.concatenate([result[:, 1], low]),
        "high": np.concatenate([result[:, 2], high]), "resamples": resamples, "seed": seed,
    }).with_columns(pl.col(pl.Float64).fill_nan(None))


def write_behaviour(con, rows: pl.DataFrame, resamples: int, seed: int) -> pl.DataFrame:
    """Replace a model's behaviour rows and intervals (per part of its heads) in one transaction; returns the
    intervals written."""
    model = rows["model"][0]
    with transaction(con):
        parities = query(con, "SELECT part, layer, head, parity FROM heads WHERE model = ?", [model])
        intervals = pl.concat([  # per part of the heads (a latent head's parts each have a parity)
            behaviour_intervals(rows, rows.select("layer", "head").join(
                group, on=["layer", "head"], how="left")["parity"], resamples, seed).with_columns(part=pl.lit(part))
            for (part,), group in parities.sort("part").group_by("part", maintain_order=True)])
        for table in ("head_behaviour", "behaviour_intervals"):
            con.execute(f"DELETE FROM {table} WHERE model = ?", [model])
        insert(con, "head_behaviour", rows)
        insert(con, "behaviour_intervals", intervals)
    return intervals
