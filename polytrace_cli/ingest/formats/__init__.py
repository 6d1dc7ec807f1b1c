"""Built-in input formats, one module each. Import order is sniffing order: specific first."""

from polytrace_cli.ingest.formats import polytrace_packed  # noqa: F401
from polytrace_cli.ingest.formats import polytrace_reward  # noqa: F401
from polytrace_cli.ingest.formats import polytrace_dapo  # noqa: F401
from polytrace_cli.ingest.formats import polytrace_multiturn  # noqa: F401
from polytrace_cli.ingest.formats import polytrace_dataset  # noqa: F401
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
import polytrace_cli.ingest.formats.verl.console  # noqa: F401
