-- Per model and part (heads.part; a latent-attention model has a row for each of its parts): medians of the
-- headline statistics, and the shares the paper quotes:
-- heads above their own random baseline in symmetric energy (paper: 76% to 99%),
-- above the baseline's mean (N+1)/(2N), and with participation ratio below 2 (paper: < 1%).
-- Shares are over the heads where the statistic is defined (a zero form has none).
-- Columns:
--   model: the model (models.model)
--   part: the heads' form (heads.part): 'whole', or a latent-attention head's 'nope' or 'rope' part, each its own row
--   heads: all the model's heads (of the part), zero forms included
--   median_symmetric_energy: median symmetric_energy ||S||^2 / ||L||^2 (0 to 1; Figure 13) over the heads where
--      defined (statistics.md section 3)
--   median_pairing: median pairing 1 - ||lambda_+ - lambda_-|| / ||S|| (0 to 1; Figure 14; per-model medians of
--      0.77 to 0.87 in the paper)
--   median_rho: median rho = ||lambda_-|| / ||lambda_+|| (0 or more) over the heads where defined
--   median_lobe_departure: median lobe_departure ||lambda_- - rho lambda_+|| / ||lambda_-|| (0 or more, 0 for
--      proportional lobes; Observation 5)
--   median_participation_ratio: median participation ratio (sum s^2)^2 / sum s^4 over the singular values s of L
--      (1 to n; median 48.5 over all heads in the paper)
--   median_stable_rank: median stable rank sum s^2 / s_1^2 (1 to n)
--   median_random_symmetric_energy: median symmetric energy of the heads' random baseline heads (seeded Gaussian
--      W_Q, W_K of the same shapes), near (N+1)/(2N)
--   median_random_pairing: median pairing of the random baseline heads
--   share_above_random: share (0 to 1) of the heads whose symmetric energy exceeds their own random baseline
--      head's, over the heads where both are defined (76% to 99% in the paper)
--   share_above_baseline_mean: share (0 to 1) of the heads whose symmetric energy exceeds the baseline's mean
--      (N+1)/(2N), N = models.d_model
--   share_participation_below_2: share (0 to 1) of the heads with participation ratio below 2 (under 1% in the
--      paper)
SELECT
    h.model,
    h.part,
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
GROUP BY h.model, h.part
ORDER BY h.model, h.part
