-- Behaviour beside form (statistics.md section 8): per model, part and parity type, the heads' median self,
-- previous-token and induction scores and self-logit, each with its 95% interval resampling layers
-- (behaviour_intervals). The row 'I+ - I-' is the difference of those two types' medians: does an I+ head attend to
-- itself more than an I- head? Heads of undefined parity (a zero form) are in no type; a model without behaviour rows
-- has no row. head_behaviour has no part (behaviour is the head's): a latent-attention head's row is typed by each of
-- its parts' parity in turn, so its model has rows for 'nope' and for 'rope', each over all its heads. The
-- output-value circuit's columns (statistics.md "The output-value circuit"): the type's median copying_score and
-- residual_copying_score (ov_heads, joined to 'whole' heads only: OV belongs to a whole head), NULL for a model
-- extracted without OV (and copying_score for one without unembedding); their intervals are copying_by_parity's.
-- Columns:
--   model: the model (models.model), one with head_behaviour rows
--   part: the heads' form whose parity types them (heads.part): 'whole', or a latent-attention head's 'nope' or
--      'rope'
--   parity: QK parity type of the heads' part (heads.parity) 'I+', 'II' or 'I-', or 'I+ - I-' for the row of
--      differences
--   heads: heads of the type with behaviour rows (NULL for the difference)
--   median_self_score: median self_score (mean attention weight A[i, i], 0 to 1; statistics.md section 8) over the
--      type's heads; for 'I+ - I-' the I+ median minus the I- median (-1 to 1)
--   self_score_low: 2.5% bound of median_self_score, resampling layers (behaviour_intervals; NULL: one layer, a
--      type absent from every resample, or no interval stored)
--   self_score_high: 97.5% bound of median_self_score, NULL as self_score_low
--   median_previous_score: median previous_score (mean A[i, i - 1], 0 to 1), the difference for 'I+ - I-'
--   previous_score_low: 2.5% bound of median_previous_score, resampling layers, NULL as self_score_low
--   previous_score_high: 97.5% bound of median_previous_score
--   median_induction_score: median induction_score (mean A[T + i, i + 1], 0 to 1), the difference for 'I+ - I-'
--   induction_score_low: 2.5% bound of median_induction_score, resampling layers, NULL as self_score_low
--   induction_score_high: 97.5% bound of median_induction_score
--   median_self_logit: median self_logit (the model's mean pre-softmax scale * q_i . k_i, a logit of either
--      sign), the difference for 'I+ - I-'
--   self_logit_low: 2.5% bound of median_self_logit, resampling layers, NULL as self_score_low
--   self_logit_high: 97.5% bound of median_self_logit
--   resamples: B of the type's behaviour_intervals (NULL: none stored)
--   median_copying_score: median ov_heads.copying_score over the type's heads, -1 to 1 (NULL: a model without OV
--      rows or without unembedding), the difference for 'I+ - I-'; its interval is in copying_by_parity
--   median_residual_copying_score: median ov_heads.residual_copying_score, -1 to 1 (NULL: a model without OV
--      rows), the difference for 'I+ - I-'; its interval is in copying_by_parity
WITH typed AS (
    SELECT b.model, h.part, h.parity, b.self_score, b.previous_score, b.induction_score, b.self_logit,
           o.copying_score, o.residual_copying_score
    FROM head_behaviour b JOIN heads h USING (model, layer, head)
    LEFT JOIN ov_heads o ON o.model = b.model AND o.layer = b.layer AND o.head = b.head AND h.part = 'whole'
    WHERE h.parity IS NOT NULL
), medians AS (
    SELECT model, part, parity, count(*) AS heads,
           median(self_score) AS median_self_score, median(previous_score) AS median_previous_score,
           median(induction_score) AS median_induction_score, median(self_logit) AS median_self_logit,
           median(copying_score) AS median_copying_score,
           median(residual_copying_score) AS median_residual_copying_score
    FROM typed GROUP BY model, part, parity
), rows AS (
    SELECT * FROM medians
    UNION ALL
    SELECT p.model, p.part, 'I+ - I-', NULL, p.median_self_score - n.median_self_score,
           p.median_previous_score - n.median_previous_score, p.median_induction_score - n.median_induction_score,
           p.median_self_logit - n.median_self_logit, p.median_copying_score - n.median_copying_score,
           p.median_residual_copying_score - n.median_residual_copying_score
    FROM medians p JOIN medians n ON n.model = p.model AND n.part = p.part AND p.parity = 'I+' AND n.parity = 'I-'
), bounds AS (
    SELECT model, part, parity,
           any_value(low) FILTER (WHERE figure = 'median_self_score') AS self_score_low,
           any_value(high) FILTER (WHERE figure = 'median_self_score') AS self_score_high,
           any_value(low) FILTER (WHERE figure = 'median_previous_score') AS previous_score_low,
           any_value(high) FILTER (WHERE figure = 'median_previous_score') AS previous_score_high,
           any_value(low) FILTER (WHERE figure = 'median_induction_score') AS induction_score_low,
           any_value(high) FILTER (WHERE figure = 'median_induction_score') AS induction_score_high,
           any_value(low) FILTER (WHERE figure = 'median_self_logit') AS self_logit_low,
           any_value(high) FILTER (WHERE figure = 'median_self_logit') AS self_logit_high,
           any_value(resamples) AS resamples
    FROM behaviour_intervals GROUP BY model, part, parity
)
SELECT r.model, r.part, r.parity, r.heads,
       r.median_self_score, b.self_score_low, b.self_score_high,
       r.median_previous_score, b.previous_score_low, b.previous_score_high,
       r.median_induction_score, b.induction_score_low, b.induction_score_high,
       r.median_self_logit, b.self_logit_low, b.self_logit_high,
       b.resamples, r.median_copying_score, r.median_residual_copying_score
FROM rows r LEFT JOIN bounds b USING (model, part, parity)
ORDER BY r.model, r.part, CASE r.parity WHEN 'I+' THEN 0 WHEN 'II' THEN 1 WHEN 'I-' THEN 2 ELSE 3 END
