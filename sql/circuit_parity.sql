-- The output-value circuit beside the query-key form (statistics.md "The output-value circuit"): per model, its
-- heads counted by QK parity (heads.parity) and OV parity (ov_heads.parity), all nine pairs of types. Heads whose
-- parity is NULL in either circuit (a zero form or a zero OV) are left out of the counts and of the shares' total;
-- a model without ov_heads rows (extracted with `qk` alone), or none of whose heads has both parities, has no row.
-- ov_heads has no part: it is joined to heads' part = 'whole' rows only (a latent-attention model has no OV rows).
-- Columns:
--   model: the model
--   qk_parity: the heads' QK parity, 'I+', 'II' or 'I-' (heads.parity)
--   ov_parity: their OV parity, 'I+', 'II' or 'I-' (ov_heads.parity)
--   heads: heads of the model with this pair of parities (0 where none)
--   share: heads over the model's heads with both parities defined, from 0 to 1
WITH paired AS (
    SELECT h.model, h.parity AS qk_parity, o.parity AS ov_parity
    FROM heads h JOIN ov_heads o USING (model, layer, head)
    WHERE h.part = 'whole' AND h.parity IS NOT NULL AND o.parity IS NOT NULL
), totals AS (
    SELECT model, count(*) AS total FROM paired GROUP BY model
), types AS (
    SELECT * FROM (VALUES ('I+', 0), ('II', 1), ('I-', 2)) AS types(parity, position)
), counted AS (
    SELECT model, qk_parity, ov_parity, count(*) AS heads FROM paired GROUP BY ALL
)
SELECT t.model, q.parity AS qk_parity, o.parity AS ov_parity, coalesce(c.heads, 0) AS heads,
       coalesce(c.heads, 0) / t.total AS share
FROM totals t CROSS JOIN types q CROSS JOIN types o
LEFT JOIN counted c ON c.model = t.model AND c.qk_parity = q.parity AND c.ov_parity = o.parity
ORDER BY t.model, q.position, o.position
