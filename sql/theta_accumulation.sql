-- Observation 2 per model: how close the profiles (a, b, c, d) lie to Theta = {a = b, cd = 0}
-- (theta_distance) and how far along Theta from the random midpoint (1/2, 1/2, 0, 0) their nearest
-- point is (theta_position), for the trained heads and their random baseline heads. A head is
-- "closer to Theta than to the midpoint" when theta_distance < theta_position: it accumulates along
-- Theta, away from the midpoint (every head is at least as close to Theta as to the midpoint, which
-- lies on Theta, so the literal comparison would always hold).
SELECT
    model,
    count(*)                                                    AS heads,
    median(theta_distance)                                      AS median_theta_distance,
    median(theta_position)                                      AS median_theta_position,
    median(random_theta_distance)                               AS median_random_theta_distance,
    median(random_theta_position)                               AS median_random_theta_position,
    avg((theta_distance < theta_position)::INT)                 AS share_closer_to_theta,
    avg((random_theta_distance < random_theta_position)::INT)   AS random_share_closer_to_theta
FROM heads
GROUP BY model
ORDER BY model
