-- The paper's published spectral_geometry.csv (scripts/spectral_geometry.py of
-- aodesky/attention-bilinear-forms): spectral_geometry without `retained` (mode_ratio is NULL where a
-- head is not retained; shape_ratio is given for every head, as the published file does). The published file has no
-- parts: only 'whole' heads (spectral_geometry.part, every head of the paper's models); a latent-attention model's
-- parts are in spectral_geometry.
-- Columns:
--   model: the model
--   layer: the layer, from 0
--   head: the query head within its layer, from 0
--   mu: minus the mode of the gamma fit of lambda_- (S_neg), < 0; NULL when that fit is not 'ok' or has no
--      interior mode (shape k <= 1)
--   nu: the mode of the gamma fit of lambda_+ (S_pos); NULL as for mu
--   tau: the mode of the gamma fit of sigma(T); NULL as for mu
--   k_plus: the gamma shape of lambda_+; NULL when that fit is not 'ok'
--   k_minus: the gamma shape of lambda_-; NULL when that fit is not 'ok'
--   k_T: the gamma shape of sigma(T); NULL when that fit is not 'ok'
--   mode_ratio: tau / sqrt(|mu| nu) (Observation 7); NULL unless mu, nu and tau all exist (retained)
--   shape_ratio: k_T / sqrt(k_plus k_minus) (Observation 8); NULL when a shape is NULL
--   sigma_lambda_correlation: correlation of the 2n sorted |eig(S)| with the 2n sorted singular values of T,
--      -1 to 1 (Observation 9); NULL when either is constant
--   geometric_mean_error: ||sigma(T) - sqrt(lambda_+ lambda_-)|| / ||sigma(T)||, >= 0 (statistics.md section 4)
SELECT
    model, layer, head, mu, nu, tau, k_plus, k_minus, k_T, mode_ratio, shape_ratio,
    sigma_lambda_correlation, geometric_mean_error
FROM spectral_geometry
WHERE part = 'whole'
ORDER BY model, layer, head
