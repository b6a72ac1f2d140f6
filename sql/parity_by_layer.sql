-- Figure 12: percent of each layer's heads by parity type, per part (heads.part) of a latent-attention model.
-- Columns:
--   model: the model
--   part: the heads' form (heads.part): 'whole', or a latent-attention head's 'nope' or 'rope' part, each its own row
--   layer: the layer, from 0
--   heads: the layer's heads, those of undefined parity included
--   pct_type_I_plus: percent of the layer's heads, 0 to 100 (one decimal), of parity Type I+ (heads.parity, at
--      the model's parity_tolerance; statistics.md section 3)
--   pct_type_II: percent of the layer's heads, 0 to 100 (one decimal), of parity Type II
--   pct_type_I_minus: percent of the layer's heads, 0 to 100 (one decimal), of parity Type I-; the three sum to
--      100 less the heads of undefined parity (S = 0)
SELECT
    model,
    part,
    layer,
    count(*)                                                  AS heads,
    round(100 * count(*) FILTER (WHERE parity = 'I+') / count(*), 1) AS pct_type_I_plus,
    round(100 * count(*) FILTER (WHERE parity = 'II') / count(*), 1) AS pct_type_II,
    round(100 * count(*) FILTER (WHERE parity = 'I-') / count(*), 1) AS pct_type_I_minus
FROM heads
GROUP BY model, part, layer
ORDER BY model, part, layer
