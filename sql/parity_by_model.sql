-- Table 2: percent of each model's heads by parity type (at the tolerance of its extraction), per part
-- (heads.part): a latent-attention model has a row for each of its parts.
-- Heads with an undefined parity (a zero form) count in `heads` but in no type.
-- Columns:
--   model: the model
--   part: the heads' form (heads.part): 'whole', or a latent-attention head's 'nope' or 'rope' part, each its own row
--   heads: the model's heads (of the part), those of undefined parity included (Table 2's heads)
--   pct_type_I_plus: percent of the model's heads, 0 to 100 (one decimal), of parity Type I+: c_sym + d_sym >
--      parity_tolerance and c_sym > d_sym (heads.parity; statistics.md section 3)
--   pct_type_II: percent of the model's heads, 0 to 100 (one decimal), of Type II: c_sym + d_sym <= parity_tolerance
--   pct_type_I_minus: percent of the model's heads, 0 to 100 (one decimal), of Type I-; the three sum to 100 less
--      the heads of undefined parity (S = 0)
SELECT
    model,
    part,
    count(*)                                                  AS heads,
    round(100 * count(*) FILTER (WHERE parity = 'I+') / count(*), 1) AS pct_type_I_plus,
    round(100 * count(*) FILTER (WHERE parity = 'II') / count(*), 1) AS pct_type_II,
    round(100 * count(*) FILTER (WHERE parity = 'I-') / count(*), 1) AS pct_type_I_minus
FROM heads
GROUP BY model, part
ORDER BY model, part
