-- The paper's published spectral_geometry.csv (scripts/spectral_geometry.py of
-- aodesky/attention-bilinear-forms): spectral_geometry without `retained` (mode_ratio is NULL where a
-- head is not retained; shape_ratio is given for every head, as the published file does).
SELECT
    model, layer, head, mu, nu, tau, k_plus, k_minus, k_T, mode_ratio, shape_ratio,
    sigma_lambda_correlation, geometric_mean_error
FROM spectral_geometry
ORDER BY model, layer, head
