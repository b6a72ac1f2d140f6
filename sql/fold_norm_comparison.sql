-- A model beside the same weights extracted with --fold-norm (same revision, architecture and qk_norm;
-- store both with --name): medians, parity shares, and the heads whose parity type changes. A local
-- digest covers the bytes a run reads, the folded gains too, so two digests of one source differ by
-- construction: those are matched by source. Heads are paired by (layer, head, part): a latent-attention model
-- is compared part by part, a row for each.
-- Columns:
--   model: the model extracted without --fold-norm (models.fold_norm NULL)
--   part: the heads' form (heads.part): 'whole', or a latent-attention head's 'nope' or 'rope' part, each its own row
--   folded_model: the same weights extracted with --fold-norm (same revision, or same source for two digests;
--      same architecture and qk_norm)
--   fold_norm: what folded_model folded, 'gain' or 'center' (models.fold_norm; statistics.md section 7)
--   heads: heads present in both models under the same (layer, head, part)
--   median_symmetric_energy: median symmetric_energy (0 to 1) of those heads in model, where defined
--   folded_median_symmetric_energy: the same median in folded_model
--   median_pairing: median pairing (0 to 1) of those heads in model, where defined
--   folded_median_pairing: the same median in folded_model
--   pct_type_I_plus: percent (0 to 100, one decimal) of the heads whose parity in model is I+ (a head of
--      undefined parity counts in the denominator only)
--   folded_pct_type_I_plus: percent (0 to 100, one decimal) of the heads whose parity in folded_model is I+
--   pct_type_II: percent of the heads whose parity in model is II
--   folded_pct_type_II: percent of the heads whose parity in folded_model is II
--   pct_type_I_minus: percent of the heads whose parity in model is I-
--   folded_pct_type_I_minus: percent of the heads whose parity in folded_model is I-
--   pct_parity_changed: percent (0 to 100, one decimal) of the heads whose parity differs between the two models
--      (a parity defined in one and NULL in the other counts as a change)
SELECT
    plain.model                                                              AS model,
    p.part                                                                   AS part,
    folded.model                                                             AS folded_model,
    folded.fold_norm                                                         AS fold_norm,
    count(*)                                                                 AS heads,
    median(p.symmetric_energy)                                               AS median_symmetric_energy,
    median(f.symmetric_energy)                                               AS folded_median_symmetric_energy,
    median(p.pairing)                                                        AS median_pairing,
    median(f.pairing)                                                        AS folded_median_pairing,
    round(100 * count(*) FILTER (WHERE p.parity = 'I+') / count(*), 1)       AS pct_type_I_plus,
    round(100 * count(*) FILTER (WHERE f.parity = 'I+') / count(*), 1)       AS folded_pct_type_I_plus,
    round(100 * count(*) FILTER (WHERE p.parity = 'II') / count(*), 1)       AS pct_type_II,
    round(100 * count(*) FILTER (WHERE f.parity = 'II') / count(*), 1)       AS folded_pct_type_II,
    round(100 * count(*) FILTER (WHERE p.parity = 'I-') / count(*), 1)       AS pct_type_I_minus,
    round(100 * count(*) FILTER (WHERE f.parity = 'I-') / count(*), 1)       AS folded_pct_type_I_minus,
    round(100 * count(*) FILTER (WHERE p.parity IS DISTINCT FROM f.parity) / count(*), 1) AS pct_parity_changed
FROM models plain
JOIN models folded
  ON (folded.revision = plain.revision
      OR (folded.revision_kind = 'digest' AND plain.revision_kind = 'digest' AND folded.source = plain.source))
 AND folded.architecture = plain.architecture
 AND folded.qk_norm IS NOT DISTINCT FROM plain.qk_norm
 AND plain.fold_norm IS NULL AND folded.fold_norm IS NOT NULL
JOIN heads p ON p.model = plain.model
JOIN heads f ON f.model = folded.model AND f.layer = p.layer AND f.head = p.head AND f.part = p.part
GROUP BY plain.model, p.part, folded.model, folded.fold_norm
ORDER BY plain.model, p.part, folded.model
