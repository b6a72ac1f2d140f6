-- The paper's published gamma_goodness_of_fit.csv (scripts/gamma_goodness_of_fit.py of
-- aodesky/attention-bilinear-forms): per head and sample, the generalized gamma and lognormal fits only,
-- compared by log-likelihood alone. component: full (L_abs), S_positive, S_negative, T; head_index
-- counts a model's heads layer by layer from 0; fit_gap = the better log-likelihood of the two minus this
-- one; best_fit: the larger log-likelihood, a tie going to generalized_gamma (the published rule).
-- A boundary generalized gamma counts with its supremum (statistics.md section 7); a failed fit is never best.
-- The published file has no parts: only the fits of 'whole' heads (fits.part, every head of the paper's models; a
-- latent-attention model's parts would repeat a head_index).
-- Columns:
--   model: the model
--   component: the sample fitted (statistics.md section 4), named as in the published file: 'full' (L_abs, the
--      n largest |lambda(L)|), 'S_positive' (S_pos, lambda_+), 'S_negative' (S_neg, lambda_-), 'T' (sigma(T))
--   head_index: the head's index in the model, layer * n_heads + head, from 0 layer by layer
--   sample_size: the values in the sample (fits.n: those above the zero tolerance, at most head_dim)
--   family: 'generalized_gamma' (fits' family 'gengamma') or 'lognormal'; two rows per head and component
--   ks_distance: Kolmogorov-Smirnov distance of the sample from the fitted distribution, 0 to 1 (a boundary
--      generalized gamma: of its limit law); NULL for a failed fit
--   log_likelihood: the fit's maximised log-likelihood (a boundary generalized gamma: the supremum approached,
--      statistics.md section 7); NULL for a failed fit
--   fit_gap: the larger log-likelihood of the head's two fits minus this one's, >= 0 (0 for the better one);
--      NULL when this fit failed
--   best_fit: whether this family wins by the published rule: the larger log-likelihood, a tie going to
--      generalized_gamma; true when only this fit succeeded, false when this fit failed
WITH two AS (
    SELECT
        f.*,
        f.layer * m.n_heads + f.head                                        AS head_index,
        max(f.loglik) OVER head                                             AS best_loglik,
        any_value(f.loglik) FILTER (WHERE f.family = 'gengamma') OVER head  AS ll_gengamma,
        any_value(f.loglik) FILTER (WHERE f.family = 'lognormal') OVER head AS ll_lognormal
    FROM fits f
    JOIN models m USING (model)
    WHERE f.family IN ('gengamma', 'lognormal') AND f.part = 'whole'
    WINDOW head AS (PARTITION BY f.model, f.layer, f.head, f.sample)
)
SELECT
    model,
    CASE sample WHEN 'L_abs' THEN 'full' WHEN 'S_pos' THEN 'S_positive' WHEN 'S_neg' THEN 'S_negative'
                ELSE sample END                                             AS component,
    head_index,
    n                                                                       AS sample_size,
    CASE family WHEN 'gengamma' THEN 'generalized_gamma' ELSE family END    AS family,
    ks                                                                      AS ks_distance,
    loglik                                                                  AS log_likelihood,
    best_loglik - loglik                                                    AS fit_gap,
    CASE family WHEN 'gengamma' THEN coalesce(loglik >= ll_lognormal, loglik IS NOT NULL)
                ELSE coalesce(loglik > ll_gengamma, loglik IS NOT NULL) END AS best_fit
FROM two
ORDER BY model, component, head_index, family
