-- Observations 7 to 9 per model: median mode ratio tau / sqrt(|mu| nu) and shape ratio
-- k_T / sqrt(k_plus k_minus) over retained heads, median sigma-lambda correlation over all heads.
SELECT
    model,
    count(*) FILTER (WHERE retained)                     AS retained,
    count(*) FILTER (WHERE NOT retained)                 AS excluded,
    median(mode_ratio) FILTER (WHERE retained)           AS median_mode_ratio,
    median(shape_ratio) FILTER (WHERE retained)          AS median_shape_ratio,
    median(sigma_lambda_correlation)                     AS median_correlation,
    median(geometric_mean_error)                         AS median_geometric_mean_error
FROM spectral_geometry
GROUP BY model
ORDER BY model
