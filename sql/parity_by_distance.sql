-- RoPE models: percent of heads by parity type, median pairing and median symmetric energy of the
-- forms L_delta = W_K^T R(delta) W_Q at each relative distance delta (delta = 0: parity_by_model).
SELECT
    model,
    delta,
    count(*)                                                  AS heads,
    round(100 * count(*) FILTER (WHERE parity = 'I+') / count(*), 1) AS pct_type_I_plus,
    round(100 * count(*) FILTER (WHERE parity = 'II') / count(*), 1) AS pct_type_II,
    round(100 * count(*) FILTER (WHERE parity = 'I-') / count(*), 1) AS pct_type_I_minus,
    median(pairing)                                           AS median_pairing,
    median(symmetric_energy)                                  AS median_symmetric_energy
FROM distance_profiles
GROUP BY model, delta
ORDER BY model, delta
