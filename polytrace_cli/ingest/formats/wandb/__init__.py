"""wandb: the offline record log, the run folder's files, tables and the UI's CSV export."""
