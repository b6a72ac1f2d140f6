-- The ranges the paper quotes: min and max across models of the per-model medians
-- (paper: mode ratio 1.01 to 1.05, shape ratio 1.02 to 1.15, correlation 0.986 to 0.997).
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
