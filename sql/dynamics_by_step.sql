-- Training dynamics: per training checkpoint (models with a training_step, extract --revisions or the
-- pythia-dynamics set), Table 2's parity shares and the medians of pairing and symmetric energy,
-- beside the random baseline's medians, in step order per base model; per part (heads.part) of a checkpoint whose
-- heads have parts (parity_by_model and model_medians joined on model and part).
-- Columns:
--   base_model: the model whose training run the checkpoint belongs to (models.base_model)
--   training_step: the checkpoint's training step, from its revision's name step<N> (models.training_step)
--   model: the checkpoint as stored (models.model)
--   part: the heads' form (heads.part): 'whole', or a latent-attention head's 'nope' or 'rope' part, each its own row
--   revision: the checkpoint's revision (models.revision)
--   heads: the checkpoint's heads, those of undefined parity included (parity_by_model)
--   pct_type_I_plus: percent (0 to 100, one decimal) of the heads of type I+, heads of undefined parity in the
--      denominator only (parity_by_model; Table 2, statistics.md section 6)
--   pct_type_II: percent (0 to 100, one decimal) of the heads of type II (parity_by_model)
--   pct_type_I_minus: percent (0 to 100, one decimal) of the heads of type I- (parity_by_model)
--   median_pairing: median pairing over the heads where defined, 0 to 1 (model_medians; statistics.md section 3)
--   median_random_pairing: median pairing of the heads' random baseline heads (model_medians)
--   median_symmetric_energy: median symmetric energy ||S||^2 / ||L||^2 over the heads where defined, 0 to 1
--      (model_medians)
--   median_random_symmetric_energy: median symmetric energy of the random baseline heads, near (N+1)/(2N)
--      (model_medians)
--   share_above_random: share (0 to 1) of the heads whose symmetric energy exceeds their own random baseline
--      head's, over the heads where both are defined (model_medians)
SELECT
    m.base_model,
    m.training_step,
    m.model,
    p.part,
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
JOIN model_medians mm USING (model, part)
WHERE m.training_step IS NOT NULL
ORDER BY m.base_model, m.training_step, m.model, p.part
