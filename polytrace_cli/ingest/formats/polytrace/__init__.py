"""PolyTrace workload traces (packed lengths, reward timings, DAPO filtering, multi-turn, the dataset JSON)."""
