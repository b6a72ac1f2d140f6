-- Observation 1: every head's symmetric part has n positive and n negative eigenvalues.
-- Per model: heads, balanced heads (n_pos = n_neg = head_dim), and the exceptions.
SELECT
    h.model,
    count(*)                                          AS heads,
    count(*) FILTER (WHERE h.balanced)                AS balanced,
    count(*) FILTER (WHERE NOT h.balanced)            AS exceptions,
    coalesce(list(printf('L%d.H%d: %d+/%d-', h.layer, h.head, h.n_pos, h.n_neg) ORDER BY h.layer, h.head)
        FILTER (WHERE NOT h.balanced), [])            AS exception_heads
FROM heads h
GROUP BY h.model
ORDER BY h.model
