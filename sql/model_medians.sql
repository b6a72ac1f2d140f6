-- Per model: medians of the headline statistics, and the shares the paper quotes:
-- heads above their own random baseline in symmetric energy (paper: 76% to 99%),
-- above the baseline's mean (N+1)/(2N), and with participation ratio below 2 (paper: < 1%).
-- Shares are over the heads where the statistic is defined (a zero form has none).
SELECT
    h.model,
    count(*)                                                          AS heads,
    median(h.symmetric_energy)                                        AS median_symmetric_energy,
    median(h.pairing)                                                 AS median_pairing,
    median(h.rho)                                                     AS median_rho,
    median(h.lobe_departure)                                          AS median_lobe_departure,
    median(h.participation_ratio)                                     AS median_participation_ratio,
    median(h.stable_rank)                                             AS median_stable_rank,
    median(h.random_symmetric_energy)                                 AS median_random_symmetric_energy,
    median(h.random_pairing)                                          AS median_random_pairing,
    avg((h.symmetric_energy > h.random_symmetric_energy)::INT)        AS share_above_random,
    avg((h.symmetric_energy > (m.d_model + 1) / (2.0 * m.d_model))::INT) AS share_above_baseline_mean,
    avg((h.participation_ratio < 2)::INT)                             AS share_participation_below_2
FROM heads h
JOIN models m USING (model)
GROUP BY h.model
ORDER BY h.model
