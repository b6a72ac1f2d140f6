-- Table 2: percent of each model's heads by parity type (at the tolerance of its extraction).
-- Heads with an undefined parity (a zero form) count in `heads` but in no type.
SELECT
    model,
    count(*)                                                  AS heads,
    round(100 * count(*) FILTER (WHERE parity = 'I+') / count(*), 1) AS pct_type_I_plus,
    round(100 * count(*) FILTER (WHERE parity = 'II') / count(*), 1) AS pct_type_II,
    round(100 * count(*) FILTER (WHERE parity = 'I-') / count(*), 1) AS pct_type_I_minus
FROM heads
GROUP BY model
ORDER BY model
