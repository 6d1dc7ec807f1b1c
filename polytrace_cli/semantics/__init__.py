"""Run semantics: what a run's numbers mean (the record), which timers its step time counts, and the per-step facts both are decided from."""
