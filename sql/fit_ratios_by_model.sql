-- Observations 7 to 9 per model: median mode ratio tau / sqrt(|mu| nu) and shape ratio
-- k_T / sqrt(k_plus k_minus) over retained heads, median sigma-lambda correlation over all heads; per model and
-- part (spectral_geometry.part): a latent-attention model has a row for each of its parts.
-- Columns:
--   model: the model (models.model)
--   part: the heads' form (heads.part): 'whole', or a latent-attention head's 'nope' or 'rope' part, each its own row
--   retained: heads whose gamma fits of S_pos, S_neg and T are 'ok' and each have an interior mode (shape above 1),
--      the heads of the two ratios (spectral_geometry.retained; statistics.md section 4)
--   excluded: the model's other heads (of the part) (550 of 9,512 in the paper)
--   median_mode_ratio: median mode ratio tau / sqrt(|mu| nu) over the retained heads (per-model medians of 1.01 to
--      1.05 in the paper); NULL: no head retained
--   median_shape_ratio: median shape ratio k_T / sqrt(k_plus k_minus) over the retained heads (1.02 to 1.15 in
--      the paper); NULL: no head retained
--   median_correlation: median sigma_lambda_correlation over all heads where defined, the correlation (-1 to 1)
--      of the 2n sorted |eig(S)| with the 2n sorted singular values of T (0.986 to 0.997 in the paper)
--   median_geometric_mean_error: median geometric_mean_error over all heads where defined,
--      ||sigma(T) - sqrt(lambda_+ lambda_-)|| / ||sigma(T)|| index-wise (0 for a rank-one form)
SELECT
    model,
    part,
    count(*) FILTER (WHERE retained)                     AS retained,
    count(*) FILTER (WHERE NOT retained)                 AS excluded,
    median(mode_ratio) FILTER (WHERE retained)           AS median_mode_ratio,
    median(shape_ratio) FILTER (WHERE retained)          AS median_shape_ratio,
    median(sigma_lambda_correlation)                     AS median_correlation,
    median(geometric_mean_error)                         AS median_geometric_mean_error
FROM spectral_geometry
GROUP BY model, part
ORDER BY model, part
