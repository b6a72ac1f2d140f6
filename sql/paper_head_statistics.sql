-- The paper's published head_statistics.csv (scripts/head_statistics.py of aodesky/attention-bilinear-forms):
-- its columns, names and order. dim is the size of the reduced form (min(N, 2n), where n_zero is counted);
-- balance = 1 - |n_pos - n_neg| / (n_pos + n_neg), the continuous balance score (1 for a balanced head).
SELECT
    model, layer, head, kv_head,
    n_pos + n_neg + n_zero                                   AS dim,
    symmetric_energy,
    1 - abs(n_pos - n_neg) / nullif(n_pos + n_neg, 0)        AS balance,
    pairing, rho, pairing_bound, pairing_gap, lobe_departure,
    n_pos, n_neg, n_zero,
    a, b, c, d, b_sym, c_sym, d_sym,
    trace_ratio, participation_ratio, stable_rank, leading_share
FROM heads
ORDER BY model, layer, head
