-- The ranges the paper quotes: min and max across models of the per-model medians
-- (paper: mode ratio 1.01 to 1.05, shape ratio 1.02 to 1.15, correlation 0.986 to 0.997).
-- Columns:
--   statistic: 'mode_ratio', 'shape_ratio' or 'sigma_lambda_correlation' (statistics.md section 4)
--   low: the smallest per-model median (fit_ratios_by_model's median_mode_ratio, median_shape_ratio or
--      median_correlation) over the warehouse's models; NULL when no model has one
--   high: the largest per-model median
--   models: the models the range is over: every model with heads (fit_ratios_by_model's rows)
--   retained_heads: the heads the medians are over: the retained heads for the ratios, every head for the
--      correlation; NULL when there is no model
--   excluded_heads: the heads left out of the ratios (a gamma mode undefined; paper: 550); 0 for the correlation
SELECT 'mode_ratio' AS statistic, min(median_mode_ratio) AS low, max(median_mode_ratio) AS high,
       count(*) AS models, sum(retained)::BIGINT AS retained_heads, sum(excluded)::BIGINT AS excluded_heads
FROM fit_ratios_by_model
UNION ALL
SELECT 'shape_ratio', min(median_shape_ratio), max(median_shape_ratio), count(*), sum(retained)::BIGINT,
       sum(excluded)::BIGINT
FROM fit_ratios_by_model
UNION ALL
SELECT 'sigma_lambda_correlation', min(median_correlation), max(median_correlation), count(*),
       sum(retained + excluded)::BIGINT, 0
FROM fit_ratios_by_model
