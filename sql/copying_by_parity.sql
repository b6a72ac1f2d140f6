-- The output-value circuit beside the query-key form (statistics.md "The output-value circuit"): per model with
-- ov_heads rows and QK parity type (heads.parity), whether its heads copy: the median copying score with its 95%
-- interval resampling layers (copying_intervals), the share of heads that copy (copying_score > 0), and the median
-- residual copying score (of OV alone) with its interval. The row 'I+ - I-' is the difference of those two types'
-- medians and shares: do the heads that favour their own token copy more than those that avoid it? Heads of
-- undefined QK parity are in no type; a model without unembedding (copying_score NULL) has NULL copying figures.
-- ov_heads and copying_intervals have no part: they are joined to heads' part = 'whole' rows only (a latent-attention
-- model has no OV rows).
-- Columns:
--   model: the model
--   parity: QK parity type 'I+', 'II', 'I-', or 'I+ - I-' for the difference of the two types' figures
--   heads: heads of the type with ov_heads rows (NULL for the difference)
--   median_copying_score: median copying_score over the type's heads, -1 to 1; for 'I+ - I-' the I+ median minus
--      the I- median (NULL: no unembedding)
--   copying_score_low: 2.5% bound of median_copying_score, resampling layers (NULL: one layer, or undefined)
--   copying_score_high: 97.5% bound of median_copying_score, NULL as copying_score_low
--   share_copying: share of the type's heads with a copying score that have copying_score > 0, from 0 to 1; for
--      'I+ - I-' the I+ share minus the I- share (NULL: no unembedding)
--   median_residual_copying_score: median residual_copying_score (the share of OV's own eigenvalues), -1 to 1;
--      the difference of the medians for 'I+ - I-'
--   residual_copying_score_low: 2.5% bound of median_residual_copying_score, resampling layers (NULL: one layer,
--      or undefined)
--   residual_copying_score_high: 97.5% bound of median_residual_copying_score, NULL as residual_copying_score_low
--   resamples: B of the intervals (NULL: none stored)
WITH typed AS (
    SELECT o.model, h.parity, o.copying_score, o.residual_copying_score
    FROM ov_heads o JOIN heads h USING (model, layer, head)
    WHERE h.part = 'whole' AND h.parity IS NOT NULL
), medians AS (
    SELECT model, parity, count(*) AS heads, median(copying_score) AS median_copying_score,
           avg((copying_score > 0)::INT) AS share_copying,
           median(residual_copying_score) AS median_residual_copying_score
    FROM typed GROUP BY model, parity
), rows AS (
    SELECT * FROM medians
    UNION ALL
    SELECT p.model, 'I+ - I-', NULL, p.median_copying_score - n.median_copying_score,
           p.share_copying - n.share_copying, p.median_residual_copying_score - n.median_residual_copying_score
    FROM medians p JOIN medians n ON n.model = p.model AND p.parity = 'I+' AND n.parity = 'I-'
), bounds AS (
    SELECT model, parity,
           any_value(low) FILTER (WHERE figure = 'median_copying_score') AS copying_score_low,
           any_value(high) FILTER (WHERE figure = 'median_copying_score') AS copying_score_high,
           any_value(low) FILTER (WHERE figure = 'median_residual_copying_score') AS residual_copying_score_low,
           any_value(high) FILTER (WHERE figure = 'median_residual_copying_score') AS residual_copying_score_high,
           any_value(resamples) AS resamples
    FROM copying_intervals GROUP BY model, parity
)
SELECT r.model, r.parity, r.heads,
       r.median_copying_score, b.copying_score_low, b.copying_score_high, r.share_copying,
       r.median_residual_copying_score, b.residual_copying_score_low, b.residual_copying_score_high,
       b.resamples
FROM rows r LEFT JOIN bounds b USING (model, parity)
ORDER BY r.model, CASE r.parity WHEN 'I+' THEN 0 WHEN 'II' THEN 1 WHEN 'I-' THEN 2 ELSE 3 END
