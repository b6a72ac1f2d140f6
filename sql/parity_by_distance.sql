-- RoPE models: percent of heads by parity type, median pairing and median symmetric energy of the
-- forms L_delta = W_K^T R(delta) W_Q at each relative distance delta (delta = 0: parity_by_model), per part
-- (heads.part): of a latent-attention model only its rotary part 'rope' has profiles.
-- Columns:
--   model: the model (a RoPE model: distance_profiles holds no other)
--   part: the heads' form (distance_profiles.part): 'whole', or a latent-attention head's rotary part 'rope'
--   delta: the relative distance, query position - key position, >= 0 (default 0, 1, 2, 4, ..., 4096; --distances)
--   heads: the model's heads with a profile at delta, those of undefined parity included
--   pct_type_I_plus: percent of those heads, 0 to 100 (one decimal), whose L_delta is Type I+ (c_sym > d_sym
--      beyond the model's parity_tolerance; statistics.md section 3)
--   pct_type_II: percent of the heads, 0 to 100 (one decimal), whose L_delta is Type II (c_sym + d_sym <=
--      parity_tolerance)
--   pct_type_I_minus: percent of the heads, 0 to 100 (one decimal), whose L_delta is Type I-; the three sum to
--      100 less the heads of undefined parity (S = 0)
--   median_pairing: median over the heads of the pairing of L_delta, 0 to 1 (NULL pairings left out)
--   median_symmetric_energy: median over the heads of ||S_delta||^2 / ||L_delta||^2, 0 to 1
SELECT
    model,
    part,
    delta,
    count(*)                                                  AS heads,
    round(100 * count(*) FILTER (WHERE parity = 'I+') / count(*), 1) AS pct_type_I_plus,
    round(100 * count(*) FILTER (WHERE parity = 'II') / count(*), 1) AS pct_type_II,
    round(100 * count(*) FILTER (WHERE parity = 'I-') / count(*), 1) AS pct_type_I_minus,
    median(pairing)                                           AS median_pairing,
    median(symmetric_energy)                                  AS median_symmetric_energy
FROM distance_profiles
GROUP BY model, part, delta
ORDER BY model, part, delta
