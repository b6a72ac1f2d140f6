-- Figure 6: per model, sample and family, the median histogram error and KS distance, and the
-- share of heads where the family fits best by histogram error (the paper's text) and by
-- log-likelihood (the published code).
WITH ranked AS (
    SELECT
        *,
        row_number() OVER (PARTITION BY model, layer, head, sample ORDER BY hist_error ASC NULLS LAST, family) AS rank_hist,
        row_number() OVER (PARTITION BY model, layer, head, sample ORDER BY loglik DESC NULLS LAST, family)   AS rank_loglik
    FROM fits
)
SELECT
    model,
    sample,
    family,
    count(*)                                   AS heads,
    median(hist_error)                         AS median_hist_error,
    median(ks)                                 AS median_ks,
    avg((rank_hist = 1 AND hist_error IS NOT NULL)::INT) AS share_best_hist_error,
    avg((rank_loglik = 1 AND loglik IS NOT NULL)::INT)   AS share_best_loglik
FROM ranked
GROUP BY model, sample, family
ORDER BY model, sample, family
