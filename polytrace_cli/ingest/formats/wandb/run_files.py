"""The JSON and YAML pieces of a wandb run folder (`wandb/run-*/files/`).

`config.yaml` holds the trainer's configuration in wandb's layout, each top-level entry wrapped as
`{key: {value: ..., desc: ...}}` (newer wandb drops `desc`). It becomes run meta: model path,
n_sampling, max_response_len, n_gpus, algorithm (and the TP size where known), and it names the
run's framework: verl configs have `actor_rollout_ref`/`trainer` sections, NeMo-RL's `grpo`, `policy`
and `cluster`; OpenRLHF configs are flat argparse namespaces with `pretrain` and
`n_samples_per_prompt`, slime's with `rollout_num_gpus` and `actor_num_gpus_per_node`.

`wandb-summary.json` holds each key's last logged value. Those values come from different steps
(validation keys from the last validation step, training keys from the last training step), so
they are not stored as one step's metrics: they go into run meta under `wandb_summary`, with
`_step` as `wandb_last_step` and `_runtime` as `wandb_runtime_s`. The step metrics themselves
come from `output.log` (the console capture, read by the verl console ingester).

Both are whole documents; the accounting unit is the top-level entry. Entries that feed the
meta are stored; wandb's own bookkeeping (`_wandb`, `wandb_version`) and entries nothing reads
(nested media references in the summary, config sections outside the fields above) are ignored
under named rules.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from polytrace_cli.errors import ErrorCode, IngestError
from polytrace_cli.ingest.base import FileContext, Ingester
from polytrace_cli.ingest.formats.tensorboard.events import claim_framework, metric_key
from polytrace_cli.ingest.registry import register


# Meta field -> dotted config paths to try, per framework, first present wins.
VERL_FIELDS = {
    "model": ("actor_rollout_ref.model.path",),
    "n_sampling": ("actor_rollout_ref.rollout.n",),
    "max_response_len": ("data.max_response_length", "actor_rollout_ref.rollout.response_length"),
    "max_prompt_len": ("data.max_prompt_length", "actor_rollout_ref.rollout.prompt_length"),
    "algorithm": ("algorithm.adv_estimator",),
    "tp_size": ("actor_rollout_ref.rollout.tensor_model_parallel_size",),
    "train_batch_size": ("data.train_batch_size",),
}
OPENRLHF_FIELDS = {
    "model": ("pretrain",),
    "n_sampling": ("n_samples_per_prompt",),
    "max_response_len": ("generate_max_len",),
    "max_prompt_len": ("prompt_max_len",),
    "algorithm": ("advantage_estimator",),
    "tp_size": ("vllm_tensor_parallel_size",),
    "train_batch_size": ("train_batch_size",),
}
# NeMo-RL's master config (`examples/configs/grpo_math_1B.yaml`) and slime's argparse namespace
# (`slime/utils/arguments.py`), as their W&B, SwanLab and MLflow backends log them.
NEMO_RL_FIELDS = {
    "model": ("policy.model_name",),
    "n_sampling": ("grpo.num_generations_per_prompt",),
    "train_batch_size": ("grpo.num_prompts_per_step",),
}
SLIME_FIELDS = {
    "model": ("hf_checkpoint",),
    "n_sampling": ("n_samples_per_prompt",),
    "max_response_len": ("rollout_max_response_len",),
    "train_batch_size": ("rollout_batch_size",),
    "colocate": ("colocate",),
}
WANDB_BOOKKEEPING = ("_wandb", "wandb_version")


def unwrap_config(document: dict) -> dict:
    """wandb's `{key: {value: v, desc: d}}` entries as `{key: v}`; bookkeeping entries dropped."""
    plain = {}
    for key, entry in document.items():
        if key in WANDB_BOOKKEEPING:
            continue
        plain[key] = entry["value"] if isinstance(entry, dict) and "value" in entry else entry
    return plain


def _lookup(config: dict, dotted: str):
    node = config
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def detect_framework(config: dict) -> str | None:
    """'verl', 'nemo_rl', 'slime', 'openrlhf' or None from an unwrapped config's keys."""
    if "actor_rollout_ref" in config or {"trainer", "algorithm"} <= config.keys():
        return "verl"
    if {"grpo", "policy", "cluster"} <= config.keys():
        return "nemo_rl"
    if "rollout_num_gpus" in config and "actor_num_gpus_per_node" in config:
        return "slime"
    if "pretrain" in config and ("n_samples_per_prompt" in config or "actor_num_nodes" in config):
        return "openrlhf"
    return None


def run_meta_from_config(config: dict, framework: str | None) -> tuple[dict, set[str]]:
    """(meta fields, top-level entries they came from) of an unwrapped config.

    n_gpus: verl = trainer.nnodes × trainer.n_gpus_per_node; NeMo-RL = cluster.num_nodes ×
    cluster.gpus_per_node; slime = actor_num_nodes × actor_num_gpus_per_node (+ rollout_num_gpus when
    not colocated); OpenRLHF = actor_num_nodes ×
    actor_num_gpus_per_node (the actor's GPUs; vLLM engines add vllm_num_engines × TP when they
    are not colocated, reported as `vllm_gpus`).
    """
    fields = {"verl": VERL_FIELDS, "openrlhf": OPENRLHF_FIELDS, "nemo_rl": NEMO_RL_FIELDS,
              "slime": SLIME_FIELDS}.get(framework, {})
    meta: dict = {}
    used: set[str] = set()
    for name, paths in fields.items():
        for dotted in paths:
            value = _lookup(config, dotted)
            if value is not None:
                meta[name] = value
                used.add(dotted.split(".")[0])
                break
    if framework == "verl":
        nodes, per_node = _lookup(config, "trainer.nnodes"), _lookup(config, "trainer.n_gpus_per_node")
        if isinstance(nodes, int) and isinstance(per_node, int):
            meta["n_gpus"] = nodes * per_node
            used.add("trainer")
    elif framework == "nemo_rl":
        nodes, per_node = _lookup(config, "cluster.num_nodes"), _lookup(config, "cluster.gpus_per_node")
        if isinstance(nodes, int) and isinstance(per_node, int):
            meta["n_gpus"] = nodes * per_node
            used.add("cluster")
    elif framework == "slime":
        nodes, per_node = config.get("actor_num_nodes"), config.get("actor_num_gpus_per_node")
        if isinstance(nodes, int) and isinstance(per_node, int):
            rollout = config.get("rollout_num_gpus")
            colocated = bool(config.get("colocate"))
            meta["n_gpus"] = nodes * per_node + (rollout if isinstance(rollout, int) and not colocated else 0)
            used.update(("actor_num_nodes", "actor_num_gpus_per_node"))
    elif framework == "openrlhf":
        nodes, per_node = config.get("actor_num_nodes"), config.get("actor_num_gpus_per_node")
        if isinstance(nodes, int) and isinstance(per_node, int):
            meta["n_gpus"] = nodes * per_node
            used.update(("actor_num_nodes", "actor_num_gpus_per_node"))
        engines, tp = config.get("vllm_num_engines"), config.get("vllm_tensor_parallel_size")
        if isinstance(engines, int) and isinstance(tp, int) and not config.get("colocate_all_models"):
            meta["vllm_gpus"] = engines * tp
            used.add("vllm_num_engines")
    return meta, used


@register
class WandbConfigIngester(Ingester):
    name = "wandb-config"
    version = "1"
    framework = None
    description = "wandb run config.yaml ({key: {value: ...}}): model, n_sampling, lengths, GPUs, framework"

    def sniff(self, path: Path, head: bytes) -> bool:
        return path.name == "config.yaml" and (b"wandb_version" in head or b"_wandb:" in head)

    def load(self, ctx: FileContext) -> None:
        import yaml

        try:
            document = yaml.safe_load(ctx.path.read_text(encoding="utf-8", errors="replace"))
        except yaml.YAMLError as error:
            raise IngestError(f"config.yaml is not valid YAML: {str(error).splitlines()[0]}",
                                  ErrorCode.UNPARSABLE_LINE) from None
        if not isinstance(document, dict):
            raise IngestError("config.yaml does not hold a mapping of config entries", ErrorCode.NOT_AN_OBJECT)
        ctx.lines = len(document)
        ctx.ignore("wandb bookkeeping", sum(1 for key in document if key in WANDB_BOOKKEEPING))
        config = unwrap_config(document)
        framework = detect_framework(config)
        meta, used = run_meta_from_config(config, framework)
        ctx.stored = len(used)
        ctx.ignore("config entry not used", len(config) - len(used))
        wandb_info = document.get("_wandb", {})
        wandb_info = wandb_info.get("value", wandb_info) if isinstance(wandb_info, dict) else {}
        versions = {k: wandb_info.get(k) for k in ("cli_version", "python_version") if wandb_info.get(k)}
        if versions:
            meta["wandb_versions"] = versions
        if framework:
            meta["framework_detected"] = framework
        ctx.run_meta.update(meta)
        claim_framework(ctx, framework)
        if isinstance(meta.get("model"), str):
            ctx.begin_writes()
            ctx.con.execute("UPDATE runs SET model = coalesce(model, ?) WHERE run_id = ?", [meta["model"], ctx.run_id])
        if not framework:
            ctx.note("config.yaml names neither a verl nor an OpenRLHF run: no run meta taken from it")


def _finite_or_text(value):
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


@register
class WandbSummaryIngester(Ingester):
    name = "wandb-summary"
    version = "1"
    framework = None
    description = "wandb-summary.json (final value of each key): run meta, not step metrics"

    def sniff(self, path: Path, head: bytes) -> bool:
        return path.name == "wandb-summary.json"

    def load(self, ctx: FileContext) -> None:
        text = ctx.path.read_text(encoding="utf-8", errors="replace")
        try:
            document = json.loads(text) if text.strip() else {}
        except json.JSONDecodeError as error:
            raise IngestError(f"wandb-summary.json is not valid JSON: {error.msg} at line {error.lineno}",
                                  ErrorCode.INVALID_JSON) from None
        except RecursionError:
            raise IngestError("wandb-summary.json is nested too deep to read", ErrorCode.INVALID_JSON) from None
        if not isinstance(document, dict):
            raise IngestError("wandb-summary.json does not hold an object", ErrorCode.NOT_AN_OBJECT)
        ctx.lines = len(document)
        summary = {}
        for key, value in document.items():
            if key == "_wandb":
                ctx.ignore("wandb bookkeeping")
            elif isinstance(value, (dict, list)):
                ctx.ignore("media or nested value")
            elif key in ("_step", "_runtime", "_timestamp"):
                ctx.stored += 1
            else:
                summary[metric_key(key)] = _finite_or_text(value)
                ctx.stored += 1
        meta = {"wandb_summary": summary}
        if isinstance(document.get("_step"), (int, float)):
            meta["wandb_last_step"] = int(document["_step"])
        if isinstance(document.get("_runtime"), (int, float)):
            meta["wandb_runtime_s"] = float(document["_runtime"])
        ctx.run_meta.update(meta)
