"""Built-in input formats, one module each. Import order is sniffing order: specific first."""

from polytrace_cli.ingest.formats import polytrace_packed  # noqa: F401
from polytrace_cli.ingest.formats import polytrace_reward  # noqa: F401
from polytrace_cli.ingest.formats import polytrace_dapo  # noqa: F401
from polytrace_cli.ingest.formats import polytrace_multiturn  # noqa: F401
from polytrace_cli.ingest.formats import polytrace_dataset  # noqa: F401
from polytrace_cli.ingest.formats import verl_jsonl  # noqa: F401
from polytrace_cli.ingest.formats import verl_rollout  # noqa: F401
from polytrace_cli.ingest.formats import slime  # noqa: F401
from polytrace_cli.ingest.formats import nemo_rl  # noqa: F401
from polytrace_cli.ingest.formats import skyrl  # noqa: F401
from polytrace_cli.ingest.formats import roll  # noqa: F401
from polytrace_cli.ingest.formats import areal  # noqa: F401
from polytrace_cli.ingest.formats import openrlhf_console  # noqa: F401
from polytrace_cli.ingest.formats import trl_console  # noqa: F401
from polytrace_cli.ingest.formats import trl_state  # noqa: F401
from polytrace_cli.ingest.formats import trackio  # noqa: F401
from polytrace_cli.ingest.formats import swanlab  # noqa: F401
from polytrace_cli.ingest.formats import clearml  # noqa: F401
from polytrace_cli.ingest.formats import mlflow_store  # noqa: F401
from polytrace_cli.ingest.formats import wandb_offline  # noqa: F401
from polytrace_cli.ingest.formats import tensorboard_events  # noqa: F401
from polytrace_cli.ingest.formats import wandb_run  # noqa: F401
from polytrace_cli.ingest.formats import wandb_table  # noqa: F401
from polytrace_cli.ingest.formats import wandb_csv  # noqa: F401
from polytrace_cli.ingest.formats import verl_console  # noqa: F401
