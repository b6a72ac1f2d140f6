-- The paper's published gamma_goodness_of_fit_summary.csv (scripts/gamma_goodness_of_fit.py of
-- aodesky/attention-bilinear-forms), from paper_gamma_goodness_of_fit: per model and component, the
-- heads, the sample size of head 0, the median and quartiles (linear interpolation, as pandas) of the
-- generalized gamma's KS distance, and each family's share of heads where it is best_fit.
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
ORDER BY model, component
