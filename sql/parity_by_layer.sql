-- Figure 12: percent of each layer's heads by parity type.
SELECT
    model,
    layer,
    count(*)                                                  AS heads,
    round(100 * count(*) FILTER (WHERE parity = 'I+') / count(*), 1) AS pct_type_I_plus,
    round(100 * count(*) FILTER (WHERE parity = 'II') / count(*), 1) AS pct_type_II,
    round(100 * count(*) FILTER (WHERE parity = 'I-') / count(*), 1) AS pct_type_I_minus
FROM heads
GROUP BY model, layer
ORDER BY model, layer
