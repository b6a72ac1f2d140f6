-- Per head, from the gamma fits (statistics.md section 4): nu = mode of lambda_+,
-- mu = minus the mode of lambda_-, tau = mode of sigma(T), and the shapes k_plus,
-- k_minus, k_T. A head is retained for the ratios when all three modes exist. Only 'ok' fits give
-- modes and shapes (a boundary or failed fit has no estimates; statistics.md section 7).
WITH gamma AS (
    SELECT
        model, layer, head,
        any_value(mode)  FILTER (WHERE sample = 'S_pos') AS nu,
        -any_value(mode) FILTER (WHERE sample = 'S_neg') AS mu,
        any_value(mode)  FILTER (WHERE sample = 'T')     AS tau,
        any_value(shape) FILTER (WHERE sample = 'S_pos') AS k_plus,
        any_value(shape) FILTER (WHERE sample = 'S_neg') AS k_minus,
        any_value(shape) FILTER (WHERE sample = 'T')     AS k_T
    FROM fits
    WHERE family = 'gamma' AND status = 'ok'
    GROUP BY model, layer, head
)
SELECT
    h.model, h.layer, h.head,
    g.mu, g.nu, g.tau, g.k_plus, g.k_minus, g.k_T,
    (g.mu IS NOT NULL AND g.nu IS NOT NULL AND g.tau IS NOT NULL) AS retained,
    g.tau / sqrt(abs(g.mu) * g.nu)                                AS mode_ratio,
    g.k_T / sqrt(g.k_plus * g.k_minus)                            AS shape_ratio,
    h.sigma_lambda_correlation,
    h.geometric_mean_error
FROM heads h
LEFT JOIN gamma g USING (model, layer, head)
ORDER BY h.model, h.layer, h.head
