-- The paper's published gamma_goodness_of_fit.csv (scripts/gamma_goodness_of_fit.py of
-- aodesky/attention-bilinear-forms): per head and sample, the generalized gamma and lognormal fits only,
-- compared by log-likelihood alone. component: full (L_abs), S_positive, S_negative, T; head_index
-- counts a model's heads layer by layer from 0; fit_gap = the better log-likelihood of the two minus this
-- one; best_fit: the larger log-likelihood, a tie going to generalized_gamma (the published rule).
-- A boundary generalized gamma counts with its supremum (statistics.md section 7); a failed fit is never best.
WITH two AS (
    SELECT
        f.*,
        f.layer * m.n_heads + f.head                                        AS head_index,
        max(f.loglik) OVER head                                             AS best_loglik,
        any_value(f.loglik) FILTER (WHERE f.family = 'gengamma') OVER head  AS ll_gengamma,
        any_value(f.loglik) FILTER (WHERE f.family = 'lognormal') OVER head AS ll_lognormal
    FROM fits f
    JOIN models m USING (model)
    WHERE f.family IN ('gengamma', 'lognormal')
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
