-- Table 2 at other Type II tolerances: Type II when c_sym + d_sym <= tolerance,
-- else Type I+ when c_sym > d_sym, else Type I-. Per model and part (heads.part), as parity_by_model.
-- Columns:
--   model: the model
--   part: the heads' form (heads.part): 'whole', or a latent-attention head's 'nope' or 'rope' part, each its own row
--   tolerance: the Type II tolerance on c_sym + d_sym: 0.01, 0.02, 0.03, 0.05 or 0.10 (0.02 = 1/50, the default
--      parity_tolerance)
--   heads: the model's heads (of the part), those with c_sym or d_sym NULL (S = 0) included
--   pct_type_I_plus: percent of the heads, 0 to 100 (one decimal), with c_sym + d_sym > tolerance and
--      c_sym > d_sym
--   pct_type_II: percent of the heads, 0 to 100 (one decimal), with c_sym + d_sym <= tolerance
--   pct_type_I_minus: percent of the heads, 0 to 100 (one decimal), with c_sym + d_sym > tolerance and
--      c_sym <= d_sym; the three sum to 100 less the heads where c_sym or d_sym is NULL
SELECT
    h.model,
    h.part,
    t.tolerance,
    count(*)                                                                          AS heads,
    round(100 * count(*) FILTER (WHERE h.c_sym + h.d_sym > t.tolerance AND h.c_sym > h.d_sym) / count(*), 1)
                                                                                      AS pct_type_I_plus,
    round(100 * count(*) FILTER (WHERE h.c_sym + h.d_sym <= t.tolerance) / count(*), 1) AS pct_type_II,
    round(100 * count(*) FILTER (WHERE h.c_sym + h.d_sym > t.tolerance AND h.c_sym <= h.d_sym) / count(*), 1)
                                                                                      AS pct_type_I_minus
FROM heads h
CROSS JOIN (VALUES (0.01::DOUBLE), (0.02), (0.03), (0.05), (0.10)) AS t(tolerance)
GROUP BY h.model, h.part, t.tolerance
ORDER BY h.model, h.part, t.tolerance
