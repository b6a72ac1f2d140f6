-- The ranges the paper quotes: min and max across models of the per-model medians
-- (paper: mode ratio 1.01 to 1.05, shape ratio 1.02 to 1.15, correlation 0.986 to 0.997).
-- Per part (fit_ratios_by_model.part): a latent-attention model's 'nope' and 'rope' medians are ranged apart from
-- each other and from the 'whole' heads' (whose rows are always there, an empty warehouse's included).
-- Columns:
--   statistic: 'mode_ratio', 'shape_ratio' or 'sigma_lambda_correlation' (statistics.md section 4)
--   part: the heads' form whose medians are ranged (heads.part): 'whole', or a latent-attention head's 'nope' or
--      'rope' part
--   low: the smallest per-model median (fit_ratios_by_model's median_mode_ratio, median_shape_ratio or
--      median_correlation) over the warehouse's models; NULL when no model has one
--   high: the largest per-model median
--   models: the models the range is over: every model with heads of the part (fit_ratios_by_model's rows)
--   retained_heads: the heads the medians are over: the retained heads for the ratios, every head for the
--      correlation; NULL when there is no model
--   excluded_heads: the heads left out of the ratios (a gamma mode undefined; paper: 550); 0 for the correlation
WITH parts AS (
    SELECT 'whole' AS part UNION SELECT part FROM fit_ratios_by_model
), ratios AS (
    SELECT p.part, r.* EXCLUDE (part) FROM parts p LEFT JOIN fit_ratios_by_model r USING (part)
)
SELECT statistic, part, low, high, models, retained_heads, excluded_heads FROM (
    SELECT 0 AS position, 'mode_ratio' AS statistic, part, min(median_mode_ratio) AS low,
           max(median_mode_ratio) AS high, count(model) AS models, sum(retained)::BIGINT AS retained_heads,
           sum(excluded)::BIGINT AS excluded_heads
    FROM ratios GROUP BY part
    UNION ALL
    SELECT 1, 'shape_ratio', part, min(median_shape_ratio), max(median_shape_ratio), count(model),
           sum(retained)::BIGINT, sum(excluded)::BIGINT
    FROM ratios GROUP BY part
    UNION ALL
    SELECT 2, 'sigma_lambda_correlation', part, min(median_correlation), max(median_correlation), count(model),
           sum(retained + excluded)::BIGINT, 0
    FROM ratios GROUP BY part
)
ORDER BY position, part
