-- Likelihood-ratio tests of the nested fits (statistics.md section 7), per model and sample: in Prentice's
-- parametrisation (compute/fits.py) the generalized gamma is a gamma at q = sigma, a Weibull at q = 1 and a
-- lognormal at q = 0, each an interior point, so D = 2 (loglik_gengamma - loglik_nested) is compared with a
-- chi-square with 1 degree of freedom; the generalized gamma improves at 1% when D > 6.634896601021214, the 99%
-- quantile of chi-square(1) (scipy.stats.chi2.ppf(0.99, 1)). Over 'ok' fits only: a head enters a test when both
-- of its fits are 'ok' (a boundary gengamma has no interior maximum, where the chi-square law would hold). Per
-- part (fits.part): a latent-attention model's parts are tested apart.
-- Columns:
--   model: the model (models.model)
--   part: the fitted heads' form (fits.part): 'whole', or a latent-attention head's 'nope' or 'rope' part
--   sample: the fitted sample, 'L_abs', 'S_pos', 'S_neg' or 'T' (statistics.md section 4)
--   heads: heads of the model (of the part) with fits of the sample (any family, any status)
--   gengamma_boundary: heads whose generalized gamma fit is 'boundary' (in no test)
--   tested_vs_gamma: heads whose gengamma and gamma fits are both 'ok', the heads of the test against the gamma
--   share_better_than_gamma: share (0 to 1) of those heads with D = 2 (loglik_gengamma - loglik_gamma) above
--      6.634896601021214, the generalized gamma better at 1%; NULL: no head tested
--   tested_vs_weibull: heads whose gengamma and weibull fits are both 'ok'
--   share_better_than_weibull: share (0 to 1) of those heads where the generalized gamma beats the Weibull at 1%
--      (D above 6.634896601021214); NULL: no head tested
--   tested_vs_lognormal: heads whose gengamma and lognormal fits are both 'ok'
--   share_better_than_lognormal: share (0 to 1) of those heads where the generalized gamma beats the lognormal at
--      1% (D above 6.634896601021214); NULL: no head tested
WITH pairs AS (
    SELECT
        model, layer, head, part, sample,
        any_value(loglik) FILTER (WHERE family = 'gengamma' AND status = 'ok')  AS ll_gengamma,
        any_value(loglik) FILTER (WHERE family = 'gamma' AND status = 'ok')     AS ll_gamma,
        any_value(loglik) FILTER (WHERE family = 'weibull' AND status = 'ok')   AS ll_weibull,
        any_value(loglik) FILTER (WHERE family = 'lognormal' AND status = 'ok') AS ll_lognormal,
        any_value(status) FILTER (WHERE family = 'gengamma')                    AS gengamma_status
    FROM fits
    GROUP BY model, layer, head, part, sample
)
SELECT
    model,
    part,
    sample,
    count(*)                                                         AS heads,
    count(*) FILTER (WHERE gengamma_status = 'boundary')             AS gengamma_boundary,
    count(ll_gengamma - ll_gamma)                                    AS tested_vs_gamma,
    avg((2 * (ll_gengamma - ll_gamma) > 6.634896601021214)::DOUBLE)     AS share_better_than_gamma,
    count(ll_gengamma - ll_weibull)                                  AS tested_vs_weibull,
    avg((2 * (ll_gengamma - ll_weibull) > 6.634896601021214)::DOUBLE)   AS share_better_than_weibull,
    count(ll_gengamma - ll_lognormal)                                AS tested_vs_lognormal,
    avg((2 * (ll_gengamma - ll_lognormal) > 6.634896601021214)::DOUBLE) AS share_better_than_lognormal
FROM pairs
GROUP BY model, part, sample
ORDER BY model, part, sample
