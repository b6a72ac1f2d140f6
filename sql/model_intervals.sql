-- Every per-model figure with its 95% bootstrap intervals beside it: the view's own value
-- (estimate), the interval resampling layers (layer_low, layer_high) and the one resampling heads
-- (head_low, head_high), with B and the seed; `shown` is "estimate [layer_low, layer_high]" (the estimate
-- alone for a model of one layer, whose layer interval is undefined). Per model and part (heads.part), as the four
-- views and the intervals (written per part) are: a part's figure meets only that part's intervals.
-- Columns:
--   model: the model (models.model)
--   part: the heads' form (heads.part): 'whole', or a latent-attention head's 'nope' or 'rope' part, each its own row
--   view: the view holding the figure: parity_by_model, model_medians, fit_ratios_by_model or theta_accumulation
--   figure: the figure's column in that view (pct_* in percent 0 to 100, share_* from 0 to 1, median_* in the
--      statistic's own units)
--   estimate: the figure's value in its view, computed now (not the stored intervals.estimate)
--   layer_low: 2.5% percentile of the figure over resamples of the model's layers (intervals, method 'layer';
--      statistics.md section 7); NULL: one layer, undefined on every resample, or no intervals stored (they are
--      written once the model's last layer is in)
--   layer_high: 97.5% percentile of the figure over the layer resamples, NULL as layer_low
--   head_low: 2.5% percentile of the figure over resamples of the model's heads (intervals, method 'head'); NULL:
--      a model of one head, undefined on every resample, or no intervals stored
--   head_high: 97.5% percentile of the figure over the head resamples, NULL as head_low
--   resamples: B of the layer interval (NULL: no intervals stored)
--   seed: the bootstrap seed of the layer interval (NULL: no intervals stored)
--   shown: the estimate to 4 significant digits, then " [layer_low, layer_high]" where the layer interval is
--      defined (NULL where the estimate is)
WITH estimates AS (
    SELECT 'parity_by_model' AS view, * FROM (
        UNPIVOT parity_by_model ON pct_type_I_plus, pct_type_II, pct_type_I_minus
        INTO NAME figure VALUE estimate)
    UNION ALL BY NAME
    SELECT 'model_medians' AS view, * FROM (
        UNPIVOT model_medians ON median_symmetric_energy, median_pairing, median_rho, median_lobe_departure,
            median_participation_ratio, median_stable_rank, median_random_symmetric_energy, median_random_pairing,
            share_above_random, share_above_baseline_mean, share_participation_below_2
        INTO NAME figure VALUE estimate)
    UNION ALL BY NAME
    SELECT 'fit_ratios_by_model' AS view, * FROM (
        UNPIVOT fit_ratios_by_model ON median_mode_ratio, median_shape_ratio, median_correlation,
            median_geometric_mean_error
        INTO NAME figure VALUE estimate)
    UNION ALL BY NAME
    SELECT 'theta_accumulation' AS view, * FROM (
        UNPIVOT theta_accumulation ON median_theta_distance, median_theta_position, median_random_theta_distance,
            median_random_theta_position, share_closer_to_theta, random_share_closer_to_theta
        INTO NAME figure VALUE estimate)
)
SELECT
    e.model, e.part, e.view, e.figure, e.estimate,
    l.low AS layer_low, l.high AS layer_high,
    h.low AS head_low, h.high AS head_high,
    l.resamples, l.seed,
    printf('%.4g', e.estimate) || coalesce(printf(' [%.4g, %.4g]', l.low, l.high), '') AS shown
FROM estimates e
LEFT JOIN intervals l
       ON l.model = e.model AND l.part = e.part AND l.view = e.view AND l.figure = e.figure AND l.method = 'layer'
LEFT JOIN intervals h
       ON h.model = e.model AND h.part = e.part AND h.view = e.view AND h.figure = e.figure AND h.method = 'head'
ORDER BY e.model, e.part, e.view, e.figure
