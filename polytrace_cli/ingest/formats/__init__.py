"""Built-in input formats, one module each. Import order is sniffing order: specific first."""

import polytrace_cli.ingest.formats.polytrace.packed  # noqa: F401
import polytrace_cli.ingest.formats.polytrace.reward  # noqa: F401
import polytrace_cli.ingest.formats.polytrace.dapo  # noqa: F401
import polytrace_cli.ingest.formats.polytrace.multiturn  # noqa: F401
import polytrace_cli.ingest.formats.polytrace.dataset  # noqa: F401
import polytrace_cli.ingest.formats.verl.jsonl  # noqa: F401
import polytrace_cli.ingest.formats.verl.rollout  # noqa: F401
import polytrace_cli.ingest.formats.openrlhf.console  # noqa: F401
import polytrace_cli.ingest.formats.trl.console  # noqa: F401
import polytrace_cli.ingest.formats.trl.trainer_state  # noqa: F401
import polytrace_cli.ingest.formats.mlflow.store  # noqa: F401
import polytrace_cli.ingest.formats.wandb.offline  # noqa: F401
import polytrace_cli.ingest.formats.tensorboard.events  # noqa: F401
import polytrace_cli.ingest.formats.wandb.run_files  # noqa: F401
import polytrace_cli.ingest.formats.wandb.table  # noqa: F401
import polytrace_cli.ingest.formats.wandb.csv_export  # noqa: F401
import polytrace_cli.ingest.formats.prometheus.scrape  # noqa: F401
import polytrace_cli.ingest.formats.prometheus.range_query  # noqa: F401
import polytrace_cli.ingest.formats.verl.console  # noqa: F401
