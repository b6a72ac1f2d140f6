-- The paper's published gamma_goodness_of_fit_summary.csv (scripts/gamma_goodness_of_fit.py of
-- aodesky/attention-bilinear-forms), from paper_gamma_goodness_of_fit: per model and component, the
-- heads, the sample size of head 0, the median and quartiles (linear interpolation, as pandas) of the
-- generalized gamma's KS distance, and each family's share of heads where it is best_fit (the published
-- rule: the larger log-likelihood, a tie to the generalized gamma). As paper_gamma_goodness_of_fit, only the fits
-- of 'whole' heads (fits.part): the published file has no parts.
-- Beside them, three columns the published file lacks (issue 21): a converged generalized gamma contains the
-- lognormal (Prentice's q = 0) and never loses by the published rule, so its share there is 1 wherever every
-- fit converged; the published shares below 1 come from scipy's gengamma.fit stopping short of the maximum.
--   generalized_gamma_interior_best_fit_share: heads whose generalized gamma is an interior ('ok') fit and
--     best_fit (a boundary fit's likelihood is only a supremum, approached at the edge, not attained);
--   generalized_gamma_aic_share, lognormal_aic_share: the smaller AIC (2 k - 2 loglik, k = 3 and 2), which
--     charges the third parameter; a tie credits each 1/2, a failed fit is never best (as fit_errors_by_model).
-- Columns:
--   model: the model
--   component: 'full' (L_abs), 'S_positive', 'S_negative' or 'T', as in paper_gamma_goodness_of_fit
--   heads: the model's heads with a generalized gamma row for the component (every head with fits)
--   sample_size_per_head: the sample size of the component's first head (lowest head_index), as published
--   gengamma_median_ks: median over the heads of the generalized gamma's ks_distance (failed fits left out)
--   gengamma_iqr_ks_low: first quartile (0.25, linear interpolation) of the generalized gamma's ks_distance
--   gengamma_iqr_ks_high: third quartile (0.75, linear interpolation) of the generalized gamma's ks_distance
--   generalized_gamma_best_fit_share: share of the heads, 0 to 1, whose generalized gamma is best_fit (the
--      published rule; a boundary fit counts with its supremum)
--   lognormal_best_fit_share: share of the heads, 0 to 1, whose lognormal is best_fit (strictly the larger
--      log-likelihood); with generalized_gamma_best_fit_share it sums to 1 unless both fits of a head failed
--   generalized_gamma_interior_best_fit_share: share of the heads, 0 to 1, whose generalized gamma is an
--      interior ('ok') fit at least as likely as the lognormal (or the lognormal failed); not in the published
--      file (issue 21)
--   generalized_gamma_aic_share: share of the heads, 0 to 1, where the generalized gamma has the smaller AIC
--      (k = 3), a tie counting 1/2, a failed fit never best (statistics.md section 7); not in the published file
--   lognormal_aic_share: the same for the lognormal (k = 2); with generalized_gamma_aic_share it sums to 1
--      unless both fits of a head failed
WITH published AS (
    SELECT
        model,
        component,
        count(*) FILTER (WHERE family = 'generalized_gamma')                              AS heads,
        arg_min(sample_size, head_index) FILTER (WHERE family = 'generalized_gamma')      AS sample_size_per_head,
        median(ks_distance) FILTER (WHERE family = 'generalized_gamma')                   AS gengamma_median_ks,
        quantile_cont(ks_distance, 0.25) FILTER (WHERE family = 'generalized_gamma')      AS gengamma_iqr_ks_low,
        quantile_cont(ks_distance, 0.75) FILTER (WHERE family = 'generalized_gamma')      AS gengamma_iqr_ks_high,
        avg(best_fit::DOUBLE) FILTER (WHERE family = 'generalized_gamma')                 AS generalized_gamma_best_fit_share,
        avg(best_fit::DOUBLE) FILTER (WHERE family = 'lognormal')                         AS lognormal_best_fit_share
    FROM paper_gamma_goodness_of_fit
    GROUP BY model, component
), pairs AS (  -- per head and sample: the two families' fits
    SELECT
        model,
        sample,
        any_value(status) FILTER (WHERE family = 'gengamma')  AS status_gengamma,
        any_value(loglik) FILTER (WHERE family = 'gengamma')  AS ll_gengamma,
        any_value(loglik) FILTER (WHERE family = 'lognormal') AS ll_lognormal,
        any_value(aic) FILTER (WHERE family = 'gengamma')     AS aic_gengamma,
        any_value(aic) FILTER (WHERE family = 'lognormal')    AS aic_lognormal
    FROM fits
    WHERE family IN ('gengamma', 'lognormal') AND part = 'whole'
    GROUP BY model, layer, head, sample
), ours AS (
    SELECT
        model,
        CASE sample WHEN 'L_abs' THEN 'full' WHEN 'S_pos' THEN 'S_positive' WHEN 'S_neg' THEN 'S_negative'
                    ELSE sample END                                                          AS component,
        avg(coalesce(status_gengamma = 'ok' AND ll_gengamma >= ll_lognormal, status_gengamma = 'ok')::DOUBLE)
                                                                                             AS generalized_gamma_interior_best_fit_share,
        avg(CASE WHEN aic_gengamma IS NULL THEN 0 WHEN aic_lognormal IS NULL THEN 1
                 WHEN aic_gengamma < aic_lognormal THEN 1 WHEN aic_gengamma = aic_lognormal THEN 0.5 ELSE 0 END)
                                                                                             AS generalized_gamma_aic_share,
        avg(CASE WHEN aic_lognormal IS NULL THEN 0 WHEN aic_gengamma IS NULL THEN 1
                 WHEN aic_lognormal < aic_gengamma THEN 1 WHEN aic_gengamma = aic_lognormal THEN 0.5 ELSE 0 END)
                                                                                             AS lognormal_aic_share
    FROM pairs
    GROUP BY ALL
)
SELECT p.*, o.generalized_gamma_interior_best_fit_share, o.generalized_gamma_aic_share, o.lognormal_aic_share
FROM published p
JOIN ours o USING (model, component)
ORDER BY model, component
