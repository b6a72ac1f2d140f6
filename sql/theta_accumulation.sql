-- Observation 2 per model: how close the profiles (a, b, c, d) lie to Theta = {a = b, cd = 0}
-- (theta_distance) and how far along Theta from the random midpoint (1/2, 1/2, 0, 0) their nearest
-- point is (theta_position), for the trained heads and their random baseline heads. A head is
-- "closer to Theta than to the midpoint" when theta_distance < theta_position: it accumulates along
-- Theta, away from the midpoint (every head is at least as close to Theta as to the midpoint, which
-- lies on Theta, so the literal comparison would always hold). Per model and part (heads.part): a
-- latent-attention model has a row for each of its parts.
-- Columns:
--   model: the model
--   part: the heads' form (heads.part): 'whole', or a latent-attention head's 'nope' or 'rope' part, each its own row
--   heads: the model's heads (of the part)
--   median_theta_distance: median of theta_distance, the Euclidean distance from the head's profile (a, b, c, d)
--      to Theta (statistics.md section 7), >= 0; NULL distances (a zero form) left out
--   median_theta_position: median of theta_position, the distance of that nearest point of Theta from
--      (1/2, 1/2, 0, 0), 0 to sqrt(3/2)
--   median_random_theta_distance: median theta_distance of the heads' random baseline heads (near 0)
--   median_random_theta_position: median theta_position of the random baseline heads (near 0)
--   share_closer_to_theta: share of the heads, 0 to 1, with theta_distance < theta_position (accumulating along
--      Theta away from the midpoint), over the heads where both are defined
--   random_share_closer_to_theta: the same share for the random baseline heads
SELECT
    model,
    part,
    count(*)                                                    AS heads,
    median(theta_distance)                                      AS median_theta_distance,
    median(theta_position)                                      AS median_theta_position,
    median(random_theta_distance)                               AS median_random_theta_distance,
    median(random_theta_position)                               AS median_random_theta_position,
    avg((theta_distance < theta_position)::INT)                 AS share_closer_to_theta,
    avg((random_theta_distance < random_theta_position)::INT)   AS random_share_closer_to_theta
FROM heads
GROUP BY model, part
ORDER BY model, part
