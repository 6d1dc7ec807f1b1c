-- verl logs: rollout-dump scores on samples, and the tqdm fallback for step time.

-- Reward score of a sample, when the source records one (verl rollout dumps).
ALTER TABLE samples ADD COLUMN score DOUBLE;

-- A console log without metric lines still yields step times from its tqdm progress bar; the
-- rows carry the step flag `tqdm_estimate`, so the estimate stays visible in the steps view.
INSERT INTO metric_aliases VALUES ('tqdm/step_s', 'step_s');
