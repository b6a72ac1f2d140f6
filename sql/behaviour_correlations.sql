-- Behaviour beside form (statistics.md section 8): per model and part, Spearman rank correlations of each head's
-- self-score and self-logit with its form's c_sym - d_sym, symmetric_energy and pairing, over the heads where both
-- are defined (`heads`); ties take their average rank. head_behaviour has no part (behaviour is the head's): a
-- latent-attention head's scores are ranked against each of its parts' statistics in turn ('nope', 'rope'). NULL
-- where fewer than three heads or a constant column. Pearson's formula on the ranks from integer sums (exact,
-- whatever order DuckDB's threads add them in): the same value on every query (DuckDB's corr over the doubles
-- differed in the last bits from one query to the next). The output-value
-- circuit (statistics.md "The output-value circuit"): the self, previous-token and induction scores against each
-- head's copying_score and residual_copying_score (ov_heads); a statistic no head of a model defines (a model
-- extracted without OV, or copying_score of one without unembedding) has no row; ov_heads has no part and is joined
-- to 'whole' heads only (OV belongs to a whole head).
-- Columns:
--   model: the model (models.model), one with head_behaviour rows
--   part: the heads' form whose statistics the scores are ranked against (heads.part): 'whole', or a
--      latent-attention head's 'nope' or 'rope'
--   score: the head's behaviour score (head_behaviour): 'self_score' or 'self_logit' against the form's
--      statistics; 'self_score', 'previous_score' or 'induction_score' against the copying scores
--   statistic: what the score is ranked against: 'c_sym_minus_d_sym' (heads.c_sym - heads.d_sym, -1 to 1),
--      'symmetric_energy' or 'pairing' (heads), 'copying_score' or 'residual_copying_score' (ov_heads)
--   heads: heads of the model where both the score and the statistic are defined (not NULL)
--   spearman: Spearman's rank correlation of the score with the statistic over those heads, -1 to 1 (NULL: fewer
--      than three heads, or either constant over them)
WITH joined AS (
    SELECT b.model, h.part, b.layer, b.head, b.self_score, b.self_logit,
           b.previous_score, b.induction_score,
           h.c_sym - h.d_sym AS c_sym_minus_d_sym, h.symmetric_energy, h.pairing,
           o.copying_score, o.residual_copying_score
    FROM head_behaviour b JOIN heads h USING (model, layer, head)
    LEFT JOIN ov_heads o ON o.model = b.model AND o.layer = b.layer AND o.head = b.head AND h.part = 'whole'
), form_scores AS (
    UNPIVOT (SELECT model, part, self_score, self_logit, c_sym_minus_d_sym, symmetric_energy, pairing FROM joined)
    ON self_score, self_logit INTO NAME score VALUE x
), ov_scores AS (
    UNPIVOT (SELECT model, part, self_score, previous_score, induction_score, copying_score, residual_copying_score
             FROM joined)
    ON self_score, previous_score, induction_score INTO NAME score VALUE x
), pairs AS (
    SELECT * FROM (UNPIVOT form_scores ON c_sym_minus_d_sym, symmetric_energy, pairing INTO NAME statistic VALUE y)
    UNION ALL
    SELECT * FROM (UNPIVOT ov_scores ON copying_score, residual_copying_score INTO NAME statistic VALUE y)
), ranked AS (  -- twice each average rank, an integer, so that the sums below are exact in any order
    SELECT model, part, score, statistic,
           2 * rank() OVER (PARTITION BY model, part, score, statistic ORDER BY x)
               + count(*) OVER (PARTITION BY model, part, score, statistic, x) - 1 AS rank_x,
           2 * rank() OVER (PARTITION BY model, part, score, statistic ORDER BY y)
               + count(*) OVER (PARTITION BY model, part, score, statistic, y) - 1 AS rank_y
    FROM pairs
), sums AS (
    SELECT model, part, score, statistic, count(*) AS heads, sum(rank_x) AS sx, sum(rank_y) AS sy,
           sum(rank_x * rank_x) AS sxx, sum(rank_y * rank_y) AS syy, sum(rank_x * rank_y) AS sxy
    FROM ranked
    GROUP BY model, part, score, statistic
)
SELECT model, part, score, statistic, heads,
       CASE WHEN heads >= 3 AND heads * sxx > sx * sx AND heads * syy > sy * sy
            THEN (heads * sxy - sx * sy)::DOUBLE
                 / sqrt((heads * sxx - sx * sx)::DOUBLE * (heads * syy - sy * sy)::DOUBLE)
       END AS spearman
FROM sums
ORDER BY model, part, score DESC, statistic
