-- Likelihood-ratio tests of the nested fits (statistics.md section 7), per model and sample: the
-- generalized gamma is a gamma at c = 1 and a Weibull at a = 1, so D = 2 (loglik_gengamma -
-- loglik_gamma) is compared with a chi-square with 1 degree of freedom (likewise for Weibull); the
-- generalized gamma improves at 1% when D > 6.634896601021214, the 99% quantile of chi-square(1)
-- (scipy.stats.chi2.ppf(0.99, 1)). Over 'ok' fits only: a head enters a test when both of its fits
-- are 'ok' (a boundary gengamma has no interior maximum, where the chi-square law would hold).
WITH pairs AS (
    SELECT
        model, layer, head, sample,
        any_value(loglik) FILTER (WHERE family = 'gengamma' AND status = 'ok') AS ll_gengamma,
        any_value(loglik) FILTER (WHERE family = 'gamma' AND status = 'ok')    AS ll_gamma,
        any_value(loglik) FILTER (WHERE family = 'weibull' AND status = 'ok')  AS ll_weibull,
        any_value(status) FILTER (WHERE family = 'gengamma')                   AS gengamma_status
    FROM fits
    GROUP BY model, layer, head, sample
)
SELECT
    model,
    sample,
    count(*)                                                         AS heads,
    count(*) FILTER (WHERE gengamma_status = 'boundary')             AS gengamma_boundary,
    count(ll_gengamma - ll_gamma)                                    AS tested_vs_gamma,
    avg((2 * (ll_gengamma - ll_gamma) > 6.634896601021214)::DOUBLE)     AS share_better_than_gamma,
    count(ll_gengamma - ll_weibull)                                  AS tested_vs_weibull,
    avg((2 * (ll_gengamma - ll_weibull) > 6.634896601021214)::DOUBLE)   AS share_better_than_weibull
FROM pairs
GROUP BY model, sample
ORDER BY model, sample
