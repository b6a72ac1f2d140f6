-- Figure 6: per model, sample and family, the median histogram error and KS distance, and the share
-- of heads where the family fits best by histogram error (the paper's text), by log-likelihood (the
-- published code), and by AIC and BIC (which charge the generalized gamma its third parameter, so
-- that nested families of different size can be compared; statistics.md section 7).
-- Best: the smallest histogram error, AIC or BIC, the largest log-likelihood, among the head's fits
-- where it is defined (a failed fit has none; a boundary fit counts with its limit law's values).
-- Tie rule: where t families tie exactly for best, each is credited 1/t of the head, so the shares
-- of a model and sample add up to one and no family wins a tie by its name. Per part (fits.part): a
-- latent-attention model's parts are fitted, compared and counted apart.
-- Columns:
--   model: the model (models.model)
--   part: the fitted heads' form (fits.part): 'whole', or a latent-attention head's 'nope' or 'rope' part
--   sample: the fitted sample, 'L_abs', 'S_pos', 'S_neg' or 'T' (statistics.md section 4)
--   family: the fitted family, 'gamma', 'lognormal', 'weibull' or 'gengamma'
--   heads: the family's fits of the sample in the model (of the part), one per head, boundary and failed fits included
--   median_hist_error: median histogram error (unit-mean sample, 20 bins; 0.12 to 0.21 in the paper) over the fits
--      that have one (ok ones, and boundary ones with their limit law's; a failed fit has none); NULL: all failed
--   median_ks: median Kolmogorov-Smirnov distance (0 to 1) over the same fits
--   share_best_hist_error: share (0 to 1) of the heads where the family has the smallest histogram error, a tie of
--      t families credited 1/t to each; over a model and sample's families the shares add up to one, less the
--      heads where no family has a value
--   share_best_loglik: the same share by the largest log-likelihood (the published code's choice)
--   share_best_aic: the same share by the smallest AIC, 2 k - 2 loglik (statistics.md section 7)
--   share_best_bic: the same share by the smallest BIC, k ln(n) - 2 loglik (statistics.md section 7)
--   boundary_fits: the family's fits of the sample with status 'boundary' (a limit law; statistics.md section 7)
--   failed_fits: the family's fits of the sample with status 'failed' (no fit)
WITH best AS (
    SELECT
        *,
        hist_error = min(hist_error) OVER head AS best_hist,
        loglik = max(loglik) OVER head         AS best_loglik,
        aic = min(aic) OVER head               AS best_aic,
        bic = min(bic) OVER head               AS best_bic
    FROM fits
    WINDOW head AS (PARTITION BY model, layer, head, part, sample)
),
credit AS (
    SELECT
        *,
        coalesce(best_hist::DOUBLE / sum(best_hist::INT) OVER head, 0)     AS credit_hist,
        coalesce(best_loglik::DOUBLE / sum(best_loglik::INT) OVER head, 0) AS credit_loglik,
        coalesce(best_aic::DOUBLE / sum(best_aic::INT) OVER head, 0)       AS credit_aic,
        coalesce(best_bic::DOUBLE / sum(best_bic::INT) OVER head, 0)       AS credit_bic
    FROM best
    WINDOW head AS (PARTITION BY model, layer, head, part, sample)
)
SELECT
    model,
    part,
    sample,
    family,
    count(*)                                   AS heads,
    median(hist_error)                         AS median_hist_error,
    median(ks)                                 AS median_ks,
    avg(credit_hist)                           AS share_best_hist_error,
    avg(credit_loglik)                         AS share_best_loglik,
    avg(credit_aic)                            AS share_best_aic,
    avg(credit_bic)                            AS share_best_bic,
    count(*) FILTER (WHERE status = 'boundary') AS boundary_fits,
    count(*) FILTER (WHERE status = 'failed')   AS failed_fits
FROM credit
GROUP BY model, part, sample, family
ORDER BY model, part, sample, family
