-- verl logs: rollout-dump scores on samples.

-- Reward score of a sample, when the source records one (verl rollout dumps).
ALTER TABLE samples ADD COLUMN score DOUBLE;
