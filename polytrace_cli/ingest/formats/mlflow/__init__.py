"""MLflow's local stores (file store and SQLite)."""
