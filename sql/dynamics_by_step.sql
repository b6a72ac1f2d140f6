-- Training dynamics: per training checkpoint (models with a training_step, extract --revisions or the
-- pythia-dynamics set), Table 2's parity shares and the medians of pairing and symmetric energy,
-- beside the random baseline's medians, in step order per base model.
SELECT
    m.base_model,
    m.training_step,
    m.model,
    m.revision,
    p.heads,
    p.pct_type_I_plus,
    p.pct_type_II,
    p.pct_type_I_minus,
    mm.median_pairing,
    mm.median_random_pairing,
    mm.median_symmetric_energy,
    mm.median_random_symmetric_energy,
    mm.share_above_random
FROM models m
JOIN parity_by_model p USING (model)
JOIN model_medians mm USING (model)
WHERE m.training_step IS NOT NULL
ORDER BY m.base_model, m.training_step, m.model
