-- Behaviour beside form (statistics.md section 8): per model, Spearman rank correlations of each head's self-score
-- and self-logit with its form's c_sym - d_sym, symmetric_energy and pairing, over the heads where both are
-- defined (`heads`); ties take their average rank. NULL where fewer than three heads or a constant column.
WITH joined AS (
    SELECT b.model, b.layer, b.head, b.self_score, b.self_logit,
           h.c_sym - h.d_sym AS c_sym_minus_d_sym, h.symmetric_energy, h.pairing
    FROM head_behaviour b JOIN heads h USING (model, layer, head)
), scores AS (
    UNPIVOT joined ON self_score, self_logit INTO NAME score VALUE x
), pairs AS (
    UNPIVOT scores ON c_sym_minus_d_sym, symmetric_energy, pairing INTO NAME statistic VALUE y
), ranked AS (
    SELECT model, score, statistic,
           rank() OVER (PARTITION BY model, score, statistic ORDER BY x)
               + (count(*) OVER (PARTITION BY model, score, statistic, x) - 1) / 2.0 AS rank_x,
           rank() OVER (PARTITION BY model, score, statistic ORDER BY y)
               + (count(*) OVER (PARTITION BY model, score, statistic, y) - 1) / 2.0 AS rank_y
    FROM pairs
)
SELECT model, score, statistic, count(*) AS heads,
       CASE WHEN count(*) >= 3 AND stddev_pop(rank_x) > 0 AND stddev_pop(rank_y) > 0
            THEN corr(rank_x, rank_y) END AS spearman
FROM ranked
GROUP BY model, score, statistic
ORDER BY model, score DESC, statistic
