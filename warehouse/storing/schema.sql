-- The headforms warehouse. Column names are a contract: users' SQL relies on them.

-- One row per extracted model, with provenance and the settings its numbers depend on.
CREATE TABLE IF NOT EXISTS models (
    model               VARCHAR PRIMARY KEY,  -- the model's name (extract --name, else from the source)
    source              VARCHAR NOT NULL,   -- what was asked for: hub id, path, pkg:NAME
    revision            VARCHAR NOT NULL,   -- a commit, --revision, or sha256:<hex> (revision_kind)
    architecture        VARCHAR NOT NULL,   -- config model_type / GGUF architecture
    positional_encoding VARCHAR,            -- positional encoding: learned, absolute, rope, alibi, none (NoPE)
    n_layers            INTEGER NOT NULL,   -- layers of the model (layer 0 .. n_layers - 1)
    n_heads             INTEGER NOT NULL,   -- query heads per layer
    n_kv_heads          INTEGER NOT NULL,   -- key/value heads per layer (fewer than n_heads: grouped-query attention)
    d_model             INTEGER NOT NULL,   -- N, the width the heads read (columns of W_Q, W_K)
    head_dim            INTEGER NOT NULL,   -- n, the head dimension (rows of W_Q, W_K per head)
    score_scale         DOUBLE,             -- factor on q.k before the softmax (not applied to L)
    qk_norm             VARCHAR,            -- NULL, or 'folded' when norm gains were folded in
    config              JSON,               -- the checkpoint's config or GGUF metadata, plus 'rope' for RoPE models
    parity_tolerance    DOUBLE NOT NULL,    -- parity's type II bound on c_sym + d_sym (--parity-tolerance, default 1/50)
    baseline_seed       BIGINT NOT NULL,    -- extract --seed, of the random baseline heads (and bootstrap, k-means)
    tool_version        VARCHAR NOT NULL,   -- headforms version that extracted the model
    extracted_at        TIMESTAMP NOT NULL, -- UTC start of the extraction run that wrote (or completed) the model
    complete            BOOLEAN NOT NULL    -- false while layers are still missing
);
-- Training checkpoints (extract --revisions, set files): the model a revision belongs to, and its step.
ALTER TABLE models ADD COLUMN IF NOT EXISTS base_model VARCHAR;      -- NULL unless a training checkpoint
ALTER TABLE models ADD COLUMN IF NOT EXISTS training_step BIGINT;    -- from the revision's name step<N>, else NULL
-- What a run cost (added after the first release: a warehouse from before gets the columns, NULL).
ALTER TABLE models ADD COLUMN IF NOT EXISTS bytes_fetched BIGINT;     -- bytes fetched from the hub, NULL for local files
ALTER TABLE models ADD COLUMN IF NOT EXISTS checkpoint_bytes BIGINT;  -- bytes of the checkpoint's weight files
-- What the revision is: 'hub' (commit), 'hf-cache' (a Hugging Face cache snapshot's commit), 'given' (--revision),
-- 'digest' (sha256:<hex> of the headers and the tensors read; pending:<hex> until a first run has read them all).
ALTER TABLE models ADD COLUMN IF NOT EXISTS revision_kind VARCHAR;  -- 'hub', 'hf-cache', 'given' or 'digest'


-- Progress: a layer is listed once all its rows are committed (one transaction).
CREATE TABLE IF NOT EXISTS layers (
    model      VARCHAR NOT NULL,    -- the model (models.model)
    layer      INTEGER NOT NULL,    -- layer, from 0
    heads      INTEGER NOT NULL,    -- query heads written for the layer (models.n_heads)
    seconds    DOUBLE,              -- seconds to read and analyse the layer (its commit not included)
    written_at TIMESTAMP NOT NULL,  -- UTC time the layer's rows were computed (committed with them)
    PRIMARY KEY (model, layer)
);

-- One row per query head; statistics.md section 3. NULL where a statistic is undefined.
CREATE TABLE IF NOT EXISTS heads (
    model                    VARCHAR NOT NULL,  -- the model (models.model)
    layer                    INTEGER NOT NULL,  -- layer, from 0
    head                     INTEGER NOT NULL,  -- query head within the layer, from 0
    part                     VARCHAR NOT NULL DEFAULT 'whole',  -- the head's form: 'whole', or a latent-attention head's 'nope' / 'rope' (statistics.md, "Parts of a head")
    kv_head                  INTEGER NOT NULL,  -- the key head h // (n_heads / n_kv_heads) whose W_K it reads (GQA)
    frobenius                DOUBLE,    -- ||L||, the Frobenius norm of L = W_K^T W_Q (statistics.md section 1)
    n_pos                    INTEGER NOT NULL,  -- eigenvalues of S above tol = 1e-9 max|eig(S)|
    n_neg                    INTEGER NOT NULL,  -- eigenvalues of S below -tol
    n_zero                   INTEGER NOT NULL,  -- the rest, in the reduced min(N, 2n) space
    n_zero_ambient           INTEGER NOT NULL,  -- N - n_pos - n_neg
    balanced                 BOOLEAN NOT NULL,  -- n_pos = n_neg = head_dim (Observation 1, Theorem 3)
    symmetric_energy         DOUBLE,    -- ||S||^2 / ||L||^2, S = (L + L^T)/2 (Figure 13)
    a                        DOUBLE,    -- ||T||^2 / ||L||^2, T = (L - L^T)/2; a + b + c + d = 1
    b                        DOUBLE,    -- 2 <lambda_+, lambda_-> / ||L||^2
    c                        DOUBLE,    -- sum of u^2 over u = lambda_+ - lambda_- > 0, over ||L||^2
    d                        DOUBLE,    -- sum of u^2 over u < 0, over ||L||^2
    b_sym                    DOUBLE,    -- b with ||S||^2 as denominator (the profile of S)
    c_sym                    DOUBLE,    -- c with ||S||^2 as denominator
    d_sym                    DOUBLE,    -- d with ||S||^2 as denominator
    parity                   VARCHAR,   -- 'I+', 'II', 'I-' at the model's parity_tolerance (Table 2; NULL: S is zero)
    pairing                  DOUBLE,    -- 1 - ||lambda_+ - lambda_-|| / ||S|| (Figures 11, 14)
    rho                      DOUBLE,    -- ||lambda_-|| / ||lambda_+||
    pairing_bound            DOUBLE,    -- 1 - |1 - rho| / sqrt(1 + rho^2)
    pairing_gap              DOUBLE,    -- pairing_bound - pairing, >= 0
    lobe_departure           DOUBLE,    -- ||lambda_- - rho lambda_+|| / ||lambda_-|| (Observation 5)
    trace_ratio              DOUBLE,    -- |tr L| / ||L||
    participation_ratio      DOUBLE,    -- (sum s^2)^2 / sum s^4 over the singular values s of L
    stable_rank              DOUBLE,    -- sum s^2 / s_1^2
    leading_share            DOUBLE,    -- s_1^2 / sum s^2
    sigma_lambda_correlation DOUBLE,    -- Pearson correlation of sorted |eig(S)| and sorted singular values of T
    geometric_mean_error     DOUBLE,    -- ||sigma(T) - sqrt(lambda_+ lambda_-)|| / ||sigma(T)||, index-wise
    random_symmetric_energy  DOUBLE,    -- symmetric_energy of a same-shape Gaussian head seeded by (baseline_seed, layer)
    random_pairing           DOUBLE,    -- pairing of that Gaussian head (Figure 14's baseline)
    theta_distance           DOUBLE,    -- Observation 2: distance of (a, b, c, d) to Theta = {a = b, cd = 0}
    theta_position           DOUBLE,    -- distance of the nearest point of Theta from (1/2, 1/2, 0, 0)
    random_theta_distance    DOUBLE,    -- theta_distance of the Gaussian head
    random_theta_position    DOUBLE,    -- theta_position of the Gaussian head
    PRIMARY KEY (model, layer, head, part)
);
-- Columns added after the first release: warehouses built before them still open (the values stay NULL).
ALTER TABLE heads ADD COLUMN IF NOT EXISTS theta_distance DOUBLE;
ALTER TABLE heads ADD COLUMN IF NOT EXISTS theta_position DOUBLE;
ALTER TABLE heads ADD COLUMN IF NOT EXISTS random_theta_distance DOUBLE;
ALTER TABLE heads ADD COLUMN IF NOT EXISTS random_theta_position DOUBLE;
ALTER TABLE heads ADD COLUMN IF NOT EXISTS part VARCHAR DEFAULT 'whole';  -- older warehouses: every head 'whole'

-- Long-form spectra (statistics.md section 2), idx from 0 in decreasing order:
--   'S'       eigenvalues of S, min(N, 2n) values (the ambient zeros are implicit)
--   'S_pos'   lambda_+: positive eigenvalues of S
--   'S_neg'   lambda_-: absolute values of the negative eigenvalues of S
--   'T_sv'    singular values of T, min(N, 2n) values (in equal pairs)
--   'T_sigma' sigma(T): one value per pair, the positive imaginary parts of eig(T)
--   'L'       eigenvalues of L by decreasing magnitude (value = real part, imag), rank(L) <= n of them
--   'L_sv'    singular values of L, n of them
-- The per-head detail tables (eigenvalues, fits, distance_profiles) declare no primary key: their rows are
-- written with their heads rows, in one transaction, so the key of heads holds them, and an ART index over some
-- 600 rows a head nearly doubled the time to insert and commit them (SmolLM2's 30 layers: 0.17 s against 0.095 s).
-- `headforms check` verifies their keys instead (duplicate_rows). Warehouses built before keep their keys; both
-- are read alike.
CREATE TABLE IF NOT EXISTS eigenvalues (
    model    VARCHAR NOT NULL,   -- the model (models.model)
    layer    INTEGER NOT NULL,   -- layer, from 0
    head     INTEGER NOT NULL,   -- query head within the layer
    part     VARCHAR NOT NULL DEFAULT 'whole',  -- the head's form (heads.part)
    spectrum VARCHAR NOT NULL,   -- 'S', 'S_pos', 'S_neg', 'T_sv', 'T_sigma', 'L', 'L_sv' (the table's comment)
    idx      INTEGER NOT NULL,   -- from 0, decreasing (by magnitude for 'L')
    value    DOUBLE NOT NULL,    -- the value (real part for 'L')
    imag     DOUBLE NOT NULL     -- imaginary part ('L'), else 0; key: (model, layer, head, part, spectrum, idx)
);

-- Distribution fits (statistics.md section 4), location fixed at 0, scipy's parametrisation:
--   gamma (shape = k), lognormal (shape = s), weibull (shape = c), gengamma (shape = a, shape2 = c).
-- status (statistics.md section 7; the rule: compute/fits.py): 'ok' an interior maximum; 'boundary' the
-- likelihood is maximised only in a limit law at the edge of the parameter space (shape, shape2, scale,
-- mode NULL; loglik, ks, hist_error those of the limit law, the supremum); 'failed' no fit (all NULL).
-- A warehouse whose fits table lacks status was built by an older version and is refused (rebuild it).
CREATE TABLE IF NOT EXISTS fits (
    model      VARCHAR NOT NULL,   -- the model (models.model)
    layer      INTEGER NOT NULL,   -- layer, from 0
    head       INTEGER NOT NULL,   -- query head within the layer
    part       VARCHAR NOT NULL DEFAULT 'whole',  -- the head's form (heads.part)
    sample     VARCHAR NOT NULL,   -- 'L_abs' (the n largest |eig(L)|), 'S_pos', 'S_neg', 'T' (sigma(T))
    family     VARCHAR NOT NULL,   -- 'gamma', 'lognormal', 'weibull', 'gengamma'
    shape      DOUBLE,             -- scipy's shape: gamma k, lognormal s, weibull c, gengamma a; NULL: no estimate
    shape2     DOUBLE,             -- gengamma's c; NULL for the others
    scale      DOUBLE,             -- scipy's scale; NULL: no estimate
    mode       DOUBLE,             -- NULL when the density has no interior mode
    loglik     DOUBLE,             -- log-likelihood of the sample (boundary: the limit law's, the supremum)
    ks         DOUBLE,             -- Kolmogorov-Smirnov distance of the sample to the fitted law
    hist_error DOUBLE,             -- the paper's histogram error (unit-mean sample, 20 bins, Figure 6)
    aic        DOUBLE,             -- 2 k - 2 loglik, k free parameters: 2, or 3 for gengamma
    bic        DOUBLE,             -- k ln(n) - 2 loglik
    n          INTEGER NOT NULL,   -- sample size (values fitted)
    status     VARCHAR NOT NULL    -- 'ok', 'boundary', 'failed'; key: (model, layer, head, part, sample, family)
);
-- Every ok fit in Prentice's (1974) generalized-gamma coordinates, log x = mu + sigma w (README "### Fit
-- status, AIC and BIC"): gamma q = sigma, lognormal q = 0, Weibull q = 1; NULL unless status = 'ok'.
-- A gengamma fit's natural shape, shape2, scale are NULL where q is not bounded away from 0 (LR test, 5%).
ALTER TABLE fits ADD COLUMN IF NOT EXISTS prentice_mu DOUBLE;     -- Prentice's location mu; NULL unless status = 'ok'
ALTER TABLE fits ADD COLUMN IF NOT EXISTS prentice_sigma DOUBLE;  -- Prentice's scale sigma; NULL unless status = 'ok'
ALTER TABLE fits ADD COLUMN IF NOT EXISTS prentice_q DOUBLE;      -- Prentice's shape q; NULL unless status = 'ok'
ALTER TABLE fits ADD COLUMN IF NOT EXISTS limit_law VARCHAR;  -- a boundary fit's limit: 'powerlaw' (q -> inf), 'pareto' (q -> -inf)

-- 95% percentile bootstrap intervals of the views' per-model figures (statistics.md section 7),
-- written when a model's last layer is in. method 'layer': a model's layers are resampled with
-- replacement (all heads of each drawn layer); 'head': heads are resampled. estimate = the view's value.
CREATE TABLE IF NOT EXISTS intervals (
    model     VARCHAR NOT NULL,   -- the model (models.model)
    part      VARCHAR NOT NULL DEFAULT 'whole',  -- the heads' form whose figure it is (heads.part)
    view      VARCHAR NOT NULL,   -- the view of sql/ holding the figure
    figure    VARCHAR NOT NULL,   -- its column there
    method    VARCHAR NOT NULL,   -- 'layer' or 'head'
    estimate  DOUBLE,             -- the figure's value, as the view computes it
    low       DOUBLE,             -- 2.5% percentile of the resampled figure (NULL: one group, or undefined)
    high      DOUBLE,             -- 97.5% percentile of the resampled figure
    resamples INTEGER NOT NULL,   -- B (extract --resamples)
    seed      BIGINT NOT NULL,    -- extract --seed; resamples drawn with (seed, 0) for 'layer', (seed, 1) for 'head'
    PRIMARY KEY (model, part, view, figure, method)
);

-- Figure 5: each head's sorted unit-length spectrum of S projected on the model's three leading
-- right singular directions (x, y, z), its k-means type (0 = the largest) and its silhouette.
-- Heads whose S is zero have no row.
CREATE TABLE IF NOT EXISTS head_types (
    model      VARCHAR NOT NULL,  -- the model (models.model)
    layer      INTEGER NOT NULL,  -- layer, from 0
    head       INTEGER NOT NULL,  -- query head within the layer
    part       VARCHAR NOT NULL DEFAULT 'whole',  -- the head's form (heads.part); types are found per part
    x          DOUBLE NOT NULL,   -- Figure 5: coordinate on the first leading right singular direction
    y          DOUBLE NOT NULL,   -- on the second (0 for a model of one head)
    z          DOUBLE NOT NULL,   -- on the third (0 for a model of one or two heads)
    type       INTEGER NOT NULL,  -- k-means type, 0 = the largest; k in 2..8 by the best mean silhouette
    silhouette DOUBLE NOT NULL,   -- the head's silhouette in [-1, 1] (0 when the model has one type)
    PRIMARY KEY (model, layer, head, part)
);
-- RoPE models: the statistics of L_delta = W_K^T R(delta) W_Q at each relative distance delta = i - j
-- (query position minus key position) of models.distances; delta = 0 is the heads row's L.
CREATE TABLE IF NOT EXISTS distance_profiles (
    model            VARCHAR NOT NULL,  -- the model (models.model)
    layer            INTEGER NOT NULL,  -- layer, from 0
    head             INTEGER NOT NULL,  -- query head within the layer
    part             VARCHAR NOT NULL DEFAULT 'whole',  -- the head's form (heads.part); a part without RoPE has none
    delta            INTEGER NOT NULL,  -- relative distance i - j, one of models.distances
    frobenius        DOUBLE,    -- ||L_delta||
    symmetric_energy DOUBLE,    -- ||S_delta||^2 / ||L_delta||^2, S_delta the symmetric part of L_delta
    a                DOUBLE,    -- ||T_delta||^2 / ||L_delta||^2 (heads.a of L_delta)
    b                DOUBLE,    -- heads.b of L_delta
    c                DOUBLE,    -- heads.c of L_delta
    d                DOUBLE,    -- heads.d of L_delta
    parity           VARCHAR,   -- 'I+', 'II', 'I-' at the model's parity_tolerance
    pairing          DOUBLE     -- 1 - ||lambda_+ - lambda_-|| / ||S_delta||; key: (model, layer, head, part, delta)
);

-- Columns added after the first release (old warehouses gain them when opened for writing).
ALTER TABLE models ADD COLUMN IF NOT EXISTS fold_norm VARCHAR;     -- NULL, 'gain' or 'center' (--fold-norm)
ALTER TABLE models ADD COLUMN IF NOT EXISTS distances INTEGER[];   -- RoPE: the deltas of distance_profiles

-- A model whose layers are all in but a later step failed (its summaries) keeps its layers, complete = false,
-- and names the step; the same extract command finishes only that.
ALTER TABLE models ADD COLUMN IF NOT EXISTS failed_step VARCHAR;  -- NULL, or the step that failed after the layers
ALTER TABLE models ADD COLUMN IF NOT EXISTS attention_softcap DOUBLE;  -- logit = cap * tanh(s / cap) of the form's s
-- A hybrid (Jamba, Qwen3-Next, Granite 4 ...) mixes softmax attention with state-space or linear-attention layers:
-- only its attention layers have heads, stored under their index in the stack (layer 0 .. n_layers - 1).
ALTER TABLE models ADD COLUMN IF NOT EXISTS attention_layers INTEGER[];  -- the layers with softmax attention (NULL: built before, all)
-- gpt-oss's attention sinks: a learned logit per head that joins the softmax's denominator and no key.
ALTER TABLE heads ADD COLUMN IF NOT EXISTS sink_logit DOUBLE;  -- the head's sink logit (NULL: the family has none)
-- Warehouses built before head parts: every row is a 'whole' head's (their keys lack part, so a latent-attention
-- model, whose heads have two parts, is refused there: rebuild the warehouse to store one).
ALTER TABLE eigenvalues ADD COLUMN IF NOT EXISTS part VARCHAR DEFAULT 'whole';
ALTER TABLE fits ADD COLUMN IF NOT EXISTS part VARCHAR DEFAULT 'whole';
ALTER TABLE intervals ADD COLUMN IF NOT EXISTS part VARCHAR DEFAULT 'whole';
ALTER TABLE head_types ADD COLUMN IF NOT EXISTS part VARCHAR DEFAULT 'whole';
ALTER TABLE distance_profiles ADD COLUMN IF NOT EXISTS part VARCHAR DEFAULT 'whole';

-- Behaviour beside form (statistics.md section 8; `headforms behaviour`): per head, scores from the model's own
-- forward pass over `sequences` seeded random sequences of `length` tokens, each repeated once, and its mean
-- pre-softmax self-logit (scale applied) split into the form's part (score_scale * x^T L x from the
-- warehouse's own W_Q, W_K) and the q/k biases' part. No part: behaviour is the head's, joined by (model, layer,
-- head) to each of its rows in heads (a latent-attention head's form part is the sum of its parts', statistics.md
-- section 8).
CREATE TABLE IF NOT EXISTS head_behaviour (
    model              VARCHAR NOT NULL,  -- the model (models.model)
    layer              INTEGER NOT NULL,  -- layer, from 0
    head               INTEGER NOT NULL,  -- query head within the layer
    self_score         DOUBLE,    -- mean A[i, i], i >= 1
    previous_score     DOUBLE,    -- mean A[i, i - 1], i >= 1
    induction_score    DOUBLE,    -- mean A[T + i, i + 1], i in 1 .. T-1
    self_logit         DOUBLE,    -- the model's mean scale * q_i . k_i over positions and sequences
    form_self_logit    DOUBLE,    -- the form's mean score_scale * x_i^T L x_i (parts: their sum, with their factors)
    bias_self_logit    DOUBLE,    -- the biases' mean scale * (b_k . W_Q x_i + b_q . W_K x_i + b_q . b_k)
    reproduction_error DOUBLE,    -- max |model - form - bias| over positions and sequences
    length             INTEGER NOT NULL,  -- T, tokens per sequence before its repeat (behaviour --length)
    sequences          INTEGER NOT NULL,  -- B, the seeded random sequences (behaviour --sequences)
    seed               BIGINT NOT NULL,   -- behaviour --seed: the sequences' tokens and behaviour_intervals' resamples
    PRIMARY KEY (model, layer, head)
);
-- Per model, part, parity type ('I+', 'II', 'I-', and 'I+ - I-' for the difference of those two medians) and
-- score: the median over the type's heads with its 95% bootstrap interval resampling layers, as `intervals` does.
-- A latent-attention model's heads are typed by each part's parity in turn.
CREATE TABLE IF NOT EXISTS behaviour_intervals (
    model     VARCHAR NOT NULL,   -- the model (models.model)
    part      VARCHAR NOT NULL DEFAULT 'whole',  -- the heads' form whose parity types them (heads.part)
    parity    VARCHAR NOT NULL,   -- QK parity (heads.parity), or 'I+ - I-'
    figure    VARCHAR NOT NULL,   -- median_self_score, median_previous_score, median_induction_score, median_self_logit
    estimate  DOUBLE,             -- the median over the type's heads (or the difference of the two medians)
    low       DOUBLE,             -- 2.5% percentile of the resampled figure (NULL: one layer, or undefined)
    high      DOUBLE,             -- 97.5% percentile of the resampled figure
    resamples INTEGER NOT NULL,   -- B, resamples of the model's layers (behaviour --resamples)
    seed      BIGINT NOT NULL,    -- behaviour --seed (head_behaviour.seed)
    PRIMARY KEY (model, part, parity, figure)
);
-- Warehouses built before: every row a 'whole' part's (keyed without part, so behaviour refuses a latent model there).
ALTER TABLE behaviour_intervals ADD COLUMN IF NOT EXISTS part VARCHAR DEFAULT 'whole';

-- A quantized checkpoint (FP8, GPTQ, AWQ, compressed-tensors): its Q/K scheme (method, bits, group or block size);
-- the statistics are those of the dequantized weights. NULL for unquantized checkpoints and GGUF files.
ALTER TABLE models ADD COLUMN IF NOT EXISTS quantization VARCHAR;  -- Q/K scheme (method, bits, group/block size), else NULL

-- The output-value circuit (statistics.md "The output-value circuit"; extract --circuits qk,ov): what each head
-- writes, OV_h = W_O[h] W_V[kv(h)] (N x N, rank <= n), analysed exactly as the form L (same reduction, spectra,
-- statistics and fits; no positional treatment, score_scale does not enter). A model extracted with `qk` alone
-- has no ov_* rows.
ALTER TABLE models ADD COLUMN IF NOT EXISTS circuits VARCHAR;  -- the circuits extracted: 'qk' or 'qk,ov' (NULL: built before, 'qk')

-- One row per query head of a model extracted with the OV circuit: every column of heads, of OV_h in place of L,
-- then its copying scores (every column of heads but part and sink_logit: OV belongs to the whole head, a sink to its softmax). Joined to heads'
-- part = 'whole' rows by (model, layer, head).
CREATE TABLE IF NOT EXISTS ov_heads (
    model                    VARCHAR NOT NULL,  -- the model (models.model)
    layer                    INTEGER NOT NULL,  -- layer, from 0
    head                     INTEGER NOT NULL,  -- query head within the layer, from 0
    kv_head                  INTEGER NOT NULL,  -- the value head kv(h) whose W_V the head reads (GQA)
    frobenius                DOUBLE,    -- ||OV||
    n_pos                    INTEGER NOT NULL,  -- eigenvalues of OV's symmetric part above the tolerance
    n_neg                    INTEGER NOT NULL,  -- eigenvalues of OV's symmetric part below minus the tolerance
    n_zero                   INTEGER NOT NULL,  -- the rest, in the reduced min(N, 2n) space
    n_zero_ambient           INTEGER NOT NULL,  -- N - n_pos - n_neg
    balanced                 BOOLEAN NOT NULL,  -- n_pos = n_neg = head_dim
    symmetric_energy         DOUBLE,    -- ||S||^2 / ||OV||^2, S the symmetric part of OV
    a                        DOUBLE,    -- ||T||^2 / ||OV||^2, T the antisymmetric part of OV
    b                        DOUBLE,    -- 2 <lambda_+, lambda_-> / ||OV||^2
    c                        DOUBLE,    -- sum of u^2 over u = lambda_+ - lambda_- > 0, over ||OV||^2
    d                        DOUBLE,    -- sum of u^2 over u < 0, over ||OV||^2
    b_sym                    DOUBLE,    -- b with ||S||^2 as denominator
    c_sym                    DOUBLE,    -- c with ||S||^2 as denominator
    d_sym                    DOUBLE,    -- d with ||S||^2 as denominator
    parity                   VARCHAR,   -- OV's 'I+', 'II', 'I-' at the model's parity_tolerance (NULL: OV is zero)
    pairing                  DOUBLE,    -- 1 - ||lambda_+ - lambda_-|| / ||S||
    rho                      DOUBLE,    -- ||lambda_-|| / ||lambda_+||
    pairing_bound            DOUBLE,    -- 1 - |1 - rho| / sqrt(1 + rho^2)
    pairing_gap              DOUBLE,    -- pairing_bound - pairing
    lobe_departure           DOUBLE,    -- ||lambda_- - rho lambda_+|| / ||lambda_-||
    trace_ratio              DOUBLE,    -- |tr OV| / ||OV||
    participation_ratio      DOUBLE,    -- (sum s^2)^2 / sum s^4 over the singular values s of OV
    stable_rank              DOUBLE,    -- sum s^2 / s_1^2
    leading_share            DOUBLE,    -- s_1^2 / sum s^2
    sigma_lambda_correlation DOUBLE,    -- correlation of the sorted |eig(S)| with the sorted singular values of T
    geometric_mean_error     DOUBLE,    -- ||sigma(T) - sqrt(lambda_+ lambda_-)|| / ||sigma(T)||
    random_symmetric_energy  DOUBLE,    -- symmetric_energy of a seeded Gaussian head of the same shapes
    random_pairing           DOUBLE,    -- pairing of that Gaussian head
    theta_distance           DOUBLE,    -- distance of OV's (a, b, c, d) to Theta = {a = b, cd = 0}
    theta_position           DOUBLE,    -- distance of the nearest point of Theta from (1/2, 1/2, 0, 0)
    random_theta_distance    DOUBLE,    -- theta_distance of the Gaussian head
    random_theta_position    DOUBLE,    -- theta_position of the Gaussian head
    copying_score            DOUBLE,    -- sum(lambda) / sum(|lambda|) over the nonzero eigenvalues of W_U OV W_E^T (NULL: no unembedding)
    residual_copying_score   DOUBLE,    -- sum(lambda) / sum(|lambda|) over the nonzero eigenvalues of OV itself
    PRIMARY KEY (model, layer, head)
);

-- Long-form spectra of each head's OV, the codes and order of eigenvalues ('S', 'S_pos', 'S_neg', 'T_sv',
-- 'T_sigma', 'L', 'L_sv'), S and T the symmetric and antisymmetric parts of OV and 'L' its eigenvalues.
-- No primary key, as eigenvalues (`headforms check` verifies the key).
CREATE TABLE IF NOT EXISTS ov_eigenvalues (
    model    VARCHAR NOT NULL,  -- the model (models.model)
    layer    INTEGER NOT NULL,  -- layer, from 0
    head     INTEGER NOT NULL,  -- query head within the layer
    spectrum VARCHAR NOT NULL,  -- 'S', 'S_pos', 'S_neg', 'T_sv', 'T_sigma', 'L' (eigenvalues of OV), 'L_sv' (singular values of OV)
    idx      INTEGER NOT NULL,  -- from 0, decreasing (by magnitude for 'L')
    value    DOUBLE NOT NULL,   -- the value (real part for 'L')
    imag     DOUBLE NOT NULL    -- imaginary part ('L'), else 0; key: (model, layer, head, spectrum, idx)
);

-- Distribution fits of each head's OV samples, as fits ('L_abs' = the n largest |eig(OV)|, 'S_pos', 'S_neg', 'T'
-- of OV's parts), same families, parametrisation and status rule. No primary key, as fits.
CREATE TABLE IF NOT EXISTS ov_fits (
    model          VARCHAR NOT NULL,  -- the model (models.model)
    layer          INTEGER NOT NULL,  -- layer, from 0
    head           INTEGER NOT NULL,  -- query head within the layer
    sample         VARCHAR NOT NULL,  -- 'L_abs', 'S_pos', 'S_neg', 'T' of OV
    family         VARCHAR NOT NULL,  -- 'gamma', 'lognormal', 'weibull', 'gengamma'
    shape          DOUBLE,            -- scipy's shape (gamma k, lognormal s, weibull c, gengamma a)
    shape2         DOUBLE,            -- gengamma's c; NULL for the others
    scale          DOUBLE,            -- scipy's scale
    mode           DOUBLE,            -- NULL when the density has no interior mode
    loglik         DOUBLE,            -- log-likelihood of the sample
    ks             DOUBLE,            -- Kolmogorov-Smirnov distance
    hist_error     DOUBLE,            -- the paper's histogram error (unit-mean sample, 20 bins)
    aic            DOUBLE,            -- 2 k - 2 loglik, k free parameters: 2, or 3 for gengamma
    bic            DOUBLE,            -- k ln(n) - 2 loglik
    n              INTEGER NOT NULL,  -- sample size
    status         VARCHAR NOT NULL,  -- 'ok', 'boundary', 'failed'
    prentice_mu    DOUBLE,            -- Prentice's (1974) location mu; NULL unless status = 'ok'
    prentice_sigma DOUBLE,            -- Prentice's scale sigma; NULL unless status = 'ok'
    prentice_q     DOUBLE,            -- Prentice's shape q; NULL unless status = 'ok'
    limit_law      VARCHAR            -- a boundary fit's limit: 'powerlaw', 'pareto'; key: (model, layer, head, sample, family)
);

-- Per model with ov_heads rows, QK parity type of the head ('I+', 'II', 'I-', and 'I+ - I-' for the difference of
-- those two medians) and figure: the value over the type's heads with its 95% bootstrap interval resampling layers
-- (the resamples of intervals' method 'layer'), written when the model's last layer is in. Heads whose QK parity
-- is undefined are in no type; a NULL copying score counts in no median.
CREATE TABLE IF NOT EXISTS copying_intervals (
    model     VARCHAR NOT NULL,   -- the model (models.model)
    parity    VARCHAR NOT NULL,   -- QK parity (heads.parity), or 'I+ - I-'
    figure    VARCHAR NOT NULL,   -- median_copying_score, median_residual_copying_score
    estimate  DOUBLE,             -- the figure over the type's heads (copying_by_parity's value)
    low       DOUBLE,             -- 2.5% percentile of the resampled figure (NULL: one layer, or undefined)
    high      DOUBLE,             -- 97.5% percentile of the resampled figure
    resamples INTEGER NOT NULL,   -- B
    seed      BIGINT NOT NULL,    -- the model's seed (resamples drawn with (seed, 0), as intervals' layer method)
    PRIMARY KEY (model, parity, figure)
);
