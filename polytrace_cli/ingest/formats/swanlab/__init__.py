"""SwanLab: offline run folders (`swanlog/run-*/`), their record log and their config."""

from polytrace_cli.ingest.formats.swanlab import records  # noqa: F401
from polytrace_cli.ingest.formats.swanlab import config  # noqa: F401
