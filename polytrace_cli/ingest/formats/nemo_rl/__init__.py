"""NeMo-RL: the Perfetto workload trace."""

from polytrace_cli.ingest.formats.nemo_rl import workload_trace  # noqa: F401
