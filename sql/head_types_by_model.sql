-- Figure 5 per model: the number k of k-means head types (chosen by silhouette), the mean silhouette,
-- and the adjusted Rand index of the types against parity (1 = the same partition, 0 = chance level),
-- from the contingency table of type x parity over the heads that have both. Per part (head_types.part): a
-- latent-attention model's types are found per part, and each part's are compared with that part's parity.
-- Columns:
--   model: the model (models.model)
--   part: the heads' form (heads.part): 'whole', or a latent-attention head's 'nope' or 'rope' part, each its own row
--   heads: the model's heads (of the part) with a head type (head_types; a head whose S is zero has none)
--   k: the number of k-means types among them, chosen by mean silhouette from 2 to 8 (1 when too few distinct
--      heads for two types); statistics.md section 7, Figure 5 projection
--   silhouette: the heads' mean silhouette, -1 to 1 (0 for k = 1)
--   ari_parity: adjusted Rand index of type against parity over the heads with both (1 the same partition, 0
--      chance level, negative below it); NULL when fewer than two such heads
WITH typed AS (
    SELECT t.model, t.part, t.type, t.silhouette, h.parity
    FROM head_types t JOIN heads h USING (model, layer, head, part)
), cells AS (
    SELECT model, part, type, parity, count(*)::DOUBLE AS n FROM typed WHERE parity IS NOT NULL GROUP BY ALL
), by_type AS (
    SELECT model, part, sum(c * (c - 1) / 2) AS same_type
    FROM (SELECT model, part, type, sum(n) AS c FROM cells GROUP BY ALL) GROUP BY model, part
), by_parity AS (
    SELECT model, part, sum(c * (c - 1) / 2) AS same_parity
    FROM (SELECT model, part, parity, sum(n) AS c FROM cells GROUP BY ALL) GROUP BY model, part
), pair_counts AS (
    SELECT model, part, same_both, same_type, same_parity,
           same_type * same_parity / nullif(total * (total - 1) / 2, 0) AS expected  -- NULL for one head: no pairs
    FROM (SELECT model, part, sum(n * (n - 1) / 2) AS same_both, sum(n) AS total FROM cells GROUP BY model, part)
    JOIN by_type USING (model, part) JOIN by_parity USING (model, part)
)
SELECT
    t.model,
    t.part,
    count(*)                  AS heads,
    count(DISTINCT t.type)    AS k,
    avg(t.silhouette)         AS silhouette,
    any_value(CASE WHEN (p.same_type + p.same_parity) / 2 = p.expected THEN 1.0
                   ELSE (p.same_both - p.expected) / ((p.same_type + p.same_parity) / 2 - p.expected) END)
                              AS ari_parity
FROM typed t LEFT JOIN pair_counts p USING (model, part)
GROUP BY t.model, t.part
ORDER BY t.model, t.part
