-- Observation 1: every head's symmetric part has n positive and n negative eigenvalues.
-- Per model and part (heads.part; a latent-attention model has a row for each of its parts, n the part's own head
-- size): heads, balanced heads (n_pos = n_neg = n), and the exceptions with why they are not n+/n-.
-- Columns:
--   model: the model
--   part: the heads' form (heads.part): 'whole', or a latent-attention head's 'nope' or 'rope' part, each its own row
--   heads: the model's heads (of the part)
--   balanced: heads with n_pos = n_neg = n (Observation 1, statistics.md section 3): n = models.head_dim for a
--      'whole' head, a part's own head size for a latent-attention part (heads.balanced)
--   exceptions: heads - balanced, the heads that are not n+/n-
--   exception_heads: the exceptions as 'L<layer>.H<head>: <n_pos>+/<n_neg>-', in layer and head order; an empty
--      list when every head is balanced
--   reason: why the model's exceptions are not n+/n-, each reason with its count of heads ('; ' between), NULL when
--      every head is balanced: 'N < 2n' (S has at most N nonzero eigenvalues); 'zero gains after folding' (a
--      QK-norm model folded with qk_norm='fold' whose L has rank below n: a zero gain zeroes rows of W_Q or W_K);
--      'rank-deficient W_Q or W_K' (rank(L) < n otherwise); 'W_Q and W_K rows share directions' (rank(L) = n, yet
--      rank [W_Q; W_K] < 2n, so S has zero eigenvalues); 'eigenvalues at the zero tolerance' (none of these).
--      rank(L) counts the singular values L_sv above 1e-9 of the head's largest (statistics.py's ZERO_TOLERANCE);
--      a part's n is its count of L_sv values (eigenvalues stores n of them)
WITH exceptions AS (
    SELECT h.model, h.part, h.layer, h.head, h.n_pos, h.n_neg, h.n_zero, m.d_model, m.head_dim, m.qk_norm
    FROM heads h JOIN models m USING (model)
    WHERE NOT h.balanced
),
ranks AS (
    SELECT model, part, layer, head, count(*) FILTER (WHERE value > 1e-9 * top) AS rank_l, count(*) AS n_sv
    FROM (SELECT v.model, v.part, v.layer, v.head, v.value,
                 max(v.value) OVER (PARTITION BY v.model, v.layer, v.head, v.part) AS top
          FROM eigenvalues v SEMI JOIN exceptions e USING (model, layer, head, part)
          WHERE v.spectrum = 'L_sv')
    GROUP BY ALL
),
sized AS (  -- n: the model's head_dim for a whole head, a part's own head size (its L_sv count) for a part
    SELECT e.*, r.rank_l, CASE WHEN e.part = 'whole' THEN e.head_dim ELSE coalesce(r.n_sv, e.head_dim) END AS n
    FROM exceptions e LEFT JOIN ranks r USING (model, layer, head, part)
),
reasons AS (
    SELECT model, part,
           CASE WHEN d_model < 2 * n THEN 'N < 2n'
                WHEN coalesce(rank_l, 0) < n AND qk_norm = 'folded' THEN 'zero gains after folding'
                WHEN coalesce(rank_l, 0) < n THEN 'rank-deficient W_Q or W_K'
                WHEN n_zero > 0 THEN 'W_Q and W_K rows share directions'
                ELSE 'eigenvalues at the zero tolerance' END AS reason
    FROM sized
),
counted AS (
    SELECT model, part,
           string_agg(printf('%s (%d head%s)', reason, heads, CASE WHEN heads = 1 THEN '' ELSE 's' END), '; '
                      ORDER BY heads DESC, reason) AS reason
    FROM (SELECT model, part, reason, count(*) AS heads FROM reasons GROUP BY ALL)
    GROUP BY model, part
)
SELECT
    h.model,
    h.part,
    count(*)                                          AS heads,
    count(*) FILTER (WHERE h.balanced)                AS balanced,
    count(*) FILTER (WHERE NOT h.balanced)            AS exceptions,
    coalesce(list(printf('L%d.H%d: %d+/%d-', h.layer, h.head, h.n_pos, h.n_neg) ORDER BY h.layer, h.head)
        FILTER (WHERE NOT h.balanced), [])            AS exception_heads,
    any_value(c.reason)                               AS reason
FROM heads h LEFT JOIN counted c USING (model, part)
GROUP BY h.model, h.part
ORDER BY h.model, h.part
