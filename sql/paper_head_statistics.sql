-- The paper's published head_statistics.csv (scripts/head_statistics.py of aodesky/attention-bilinear-forms):
-- its columns, names and order. dim is the size of the reduced form (min(N, 2n), where n_zero is counted);
-- balance = 1 - |n_pos - n_neg| / (n_pos + n_neg), the continuous balance score (1 for a balanced head).
-- The published file has no parts: only heads whose score is one form (heads.part = 'whole', every head of the
-- paper's models); a latent-attention model's 'nope' and 'rope' parts are not in it (the heads table holds them).
-- Columns:
--   model: the model
--   layer: the layer, from 0
--   head: the query head within its layer, from 0
--   kv_head: the key head its W_K comes from, head // (n_heads / n_kv_heads) (statistics.md section 1)
--   dim: n_pos + n_neg + n_zero, the size min(N, 2n) of the reduced form in which the signs are counted
--   symmetric_energy: ||S||^2 / ||L||^2, 0 to 1 (statistics.md section 3, Figure 13); NULL for a zero form
--   balance: 1 - |n_pos - n_neg| / (n_pos + n_neg), 0 to 1, 1 for equal sign counts; NULL when n_pos + n_neg = 0
--   pairing: 1 - ||lambda_+ - lambda_-|| / ||S||, 0 to 1 (statistics.md section 3, Figures 11 and 14); NULL when
--      S = 0
--   rho: ||lambda_-|| / ||lambda_+||, >= 0; NULL when S has no positive eigenvalue
--   pairing_bound: 1 - |1 - rho| / sqrt(1 + rho^2), the largest pairing lobes of ratio rho allow; NULL with rho
--   pairing_gap: pairing_bound - pairing, >= 0; NULL with either
--   lobe_departure: ||lambda_- - rho lambda_+|| / ||lambda_-||, >= 0, 0 for proportional lobes (Observation 5);
--      NULL when S has no negative eigenvalue
--   n_pos: eigenvalues of S above tol = 1e-9 max|eig(S)| (statistics.md section 3)
--   n_neg: eigenvalues of S below -tol
--   n_zero: the rest, counted in the reduced min(N, 2n) space (dim - n_pos - n_neg)
--   a: ||T||^2 / ||L||^2, the antisymmetric share of the profile (a + b + c + d = 1); NULL for a zero form
--   b: 2 <lambda_+, lambda_-> / ||L||^2, the paired share of the profile; NULL for a zero form
--   c: sum of u^2 over u = lambda_+ - lambda_- > 0, over ||L||^2 (positive excess); NULL for a zero form
--   d: sum of u^2 over u < 0, over ||L||^2 (negative excess); NULL for a zero form
--   b_sym: b with ||S||^2 as denominator (the profile of S, b_sym + c_sym + d_sym = 1); NULL when S = 0
--   c_sym: c with ||S||^2 as denominator; the parity rule compares c_sym and d_sym (Table 2); NULL when S = 0
--   d_sym: d with ||S||^2 as denominator; NULL when S = 0
--   trace_ratio: |tr L| / ||L||, >= 0; NULL for a zero form
--   participation_ratio: (sum s^2)^2 / sum s^4 over the singular values s of L, 1 to n (statistics.md
--      section 3; paper: median 48.5); NULL for a zero form
--   stable_rank: sum s^2 / s_1^2, 1 to n; NULL for a zero form
--   leading_share: s_1^2 / sum s^2 = 1 / stable_rank, 0 to 1; NULL for a zero form
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
WHERE part = 'whole'
ORDER BY model, layer, head
