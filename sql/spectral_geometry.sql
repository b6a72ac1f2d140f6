-- Per head, from the gamma fits (statistics.md section 4): nu = mode of lambda_+,
-- mu = minus the mode of lambda_-, tau = mode of sigma(T), and the shapes k_plus,
-- k_minus, k_T. A head is retained for the ratios when all three modes exist. Only 'ok' fits give
-- modes and shapes (a boundary or failed fit has no estimates; statistics.md section 7). A latent-attention
-- head has a row per part, each from that part's own fits.
-- Columns:
--   model: the model
--   part: the head's form (heads.part): 'whole', or a latent-attention head's 'nope' or 'rope'
--   layer: the layer, from 0
--   head: the query head within its layer, from 0; one row per row of `heads` (head and part), with fits or not
--   mu: minus the mode (k - 1) theta of the gamma fit of S_neg (lambda_-), so < 0; NULL when that fit is not
--      'ok' or has shape k <= 1 (no interior mode)
--   nu: the mode of the gamma fit of S_pos (lambda_+), > 0; NULL as for mu
--   tau: the mode of the gamma fit of T (sigma(T)), > 0; NULL as for mu
--   k_plus: the shape k of the gamma fit of S_pos; NULL when that fit is not 'ok'
--   k_minus: the shape k of the gamma fit of S_neg; NULL when that fit is not 'ok'
--   k_T: the shape k of the gamma fit of T; NULL when that fit is not 'ok'
--   retained: true when mu, nu and tau all exist, so that the head enters the mode and shape ratios (statistics.md
--      section 4; the paper excludes 550 of its 9,512 heads)
--   mode_ratio: tau / sqrt(|mu| nu) (Observation 7, paper's per-model medians 1.01 to 1.05); NULL unless retained
--   shape_ratio: k_T / sqrt(k_plus k_minus) (Observation 8, medians 1.02 to 1.15); NULL when a shape is NULL,
--      given for heads not retained too
--   sigma_lambda_correlation: Pearson correlation of the 2n sorted |eig(S)| with the 2n sorted singular values of
--      T (Observation 9, medians 0.986 to 0.997), -1 to 1, every head; NULL when either is constant
--   geometric_mean_error: ||sigma(T) - sqrt(lambda_+ lambda_-)|| / ||sigma(T)||, index-wise in decreasing order,
--      >= 0 (0 for a rank-one form; statistics.md section 4); NULL when sigma(T) = 0
WITH gamma AS (
    SELECT
        model, layer, head, part,
        any_value(mode)  FILTER (WHERE sample = 'S_pos') AS nu,
        -any_value(mode) FILTER (WHERE sample = 'S_neg') AS mu,
        any_value(mode)  FILTER (WHERE sample = 'T')     AS tau,
        any_value(shape) FILTER (WHERE sample = 'S_pos') AS k_plus,
        any_value(shape) FILTER (WHERE sample = 'S_neg') AS k_minus,
        any_value(shape) FILTER (WHERE sample = 'T')     AS k_T
    FROM fits
    WHERE family = 'gamma' AND status = 'ok'
    GROUP BY model, layer, head, part
)
SELECT
    h.model, h.part, h.layer, h.head,
    g.mu, g.nu, g.tau, g.k_plus, g.k_minus, g.k_T,
    (g.mu IS NOT NULL AND g.nu IS NOT NULL AND g.tau IS NOT NULL) AS retained,
    g.tau / sqrt(abs(g.mu) * g.nu)                                AS mode_ratio,
    g.k_T / sqrt(g.k_plus * g.k_minus)                            AS shape_ratio,
    h.sigma_lambda_correlation,
    h.geometric_mean_error
FROM heads h
LEFT JOIN gamma g USING (model, layer, head, part)
ORDER BY h.model, h.part, h.layer, h.head
