-- Table 2 at other Type II tolerances: Type II when c_sym + d_sym <= tolerance,
-- else Type I+ when c_sym > d_sym, else Type I-.
SELECT
    h.model,
    t.tolerance,
    count(*)                                                                          AS heads,
    round(100 * count(*) FILTER (WHERE h.c_sym + h.d_sym > t.tolerance AND h.c_sym > h.d_sym) / count(*), 1)
                                                                                      AS pct_type_I_plus,
    round(100 * count(*) FILTER (WHERE h.c_sym + h.d_sym <= t.tolerance) / count(*), 1) AS pct_type_II,
    round(100 * count(*) FILTER (WHERE h.c_sym + h.d_sym > t.tolerance AND h.c_sym <= h.d_sym) / count(*), 1)
                                                                                      AS pct_type_I_minus
FROM heads h
CROSS JOIN (VALUES (0.01::DOUBLE), (0.02), (0.03), (0.05), (0.10)) AS t(tolerance)
GROUP BY h.model, t.tolerance
ORDER BY h.model, t.tolerance
