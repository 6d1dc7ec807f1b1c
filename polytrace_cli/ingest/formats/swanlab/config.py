"""The config of a SwanLab run folder (`swanlog/run-*/files/config.yaml`, beside `swanlab-metadata.json`).

SwanLab writes each top-level config entry as `{key: {value: ..., desc: ..., sort: n}}`, as wandb does
(`swanlab.init(config=...)`). The plain config gives the run meta as a wandb config does (framework,
model, n_sampling, GPUs, ...), and is kept as `swanlab_config`. The accounting unit is the top-level
entry: every entry is stored in the meta.
"""

from __future__ import annotations

from pathlib import Path

from polytrace_cli.errors import ErrorCode, IngestError
from polytrace_cli.ingest.base import FileContext, Ingester
from polytrace_cli.ingest.formats.swanlab import names
from polytrace_cli.ingest.formats.tensorboard.events import claim_framework
from polytrace_cli.ingest.formats.wandb.run_files import detect_framework, run_meta_from_config, unwrap_config
from polytrace_cli.ingest.registry import register

METADATA = "swanlab-metadata.json"


@register
class SwanlabConfigIngester(Ingester):
    name = "swanlab-config"
    version = "1"
    framework = None
    description = "SwanLab run config (swanlog/run-*/files/config.yaml beside swanlab-metadata.json)"
    metric_aliases = names.METRIC_ALIASES
    validation_prefixes = names.VALIDATION_PREFIXES

    def sniff(self, path: Path, head: bytes) -> bool:
        return path.name == "config.yaml" and (path.parent / METADATA).is_file()

    def load(self, ctx: FileContext) -> None:
        import yaml

        try:
            document = yaml.safe_load(ctx.path.read_text(encoding="utf-8", errors="replace")) or {}
        except yaml.YAMLError as error:
            where = getattr(error, "problem_mark", None)
            at = f" at line {where.line + 1}" if where is not None else ""
            raise IngestError(f"SwanLab config.yaml is not valid YAML{at}: {getattr(error, 'problem', None) or error}",
                              ErrorCode.UNPARSABLE_LINE) from None
        if not isinstance(document, dict):
            raise IngestError("SwanLab config.yaml is not a mapping", ErrorCode.NOT_AN_OBJECT)
        config = unwrap_config(document)
        ctx.lines = ctx.stored = len(document)
        framework = detect_framework(config)
        meta, _ = run_meta_from_config(config, framework)
        ctx.run_meta.update({"swanlab_config": config, **meta})
        claim_framework(ctx, framework)
