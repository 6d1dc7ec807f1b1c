"""Run metadata read from a log's content: framework version class, precision, GPUs, config.

Ingesters call these on their temporary tables and put the results in `ctx.run_meta`, which the
runner merges into `runs.meta` (later files add keys; a key already set is overwritten only by a
non-null value).
"""

from __future__ import annotations

import re

import duckdb

# Hydra overrides on a verl command line, and the meta key each one fills.
VERL_OVERRIDES: dict[str, str] = {
    "trainer.n_gpus_per_node": "n_gpus_per_node",
    "trainer.nnodes": "nnodes",
    "actor_rollout_ref.rollout.n": "n_sampling",
    "data.max_response_length": "max_response_len",
    "data.max_prompt_length": "max_prompt_len",
    "data.train_batch_size": "train_batch_size",
    "actor_rollout_ref.model.path": "model",
    "actor_rollout_ref.rollout.name": "rollout_engine",
    "algorithm.adv_estimator": "adv_estimator",
    "trainer.project_name": "project_name",
    "trainer.experiment_name": "experiment_name",
    "trainer.total_training_steps": "total_training_steps",
}
# The same settings as printed by verl's pprint of its resolved config (`'max_response_length': 1024`);
# used only when no command-line override names them. `rollout.n` is not among them: `'n'` is ambiguous.
VERL_CONFIG_KEYS: dict[str, str] = {
    "n_gpus_per_node": "n_gpus_per_node",
    "nnodes": "nnodes",
    "max_response_length": "max_response_len",
    "max_prompt_length": "max_prompt_len",
}

_OVERRIDE_PATTERN = r"(?:^|[\s'\"\[,+])((?:trainer|data|actor_rollout_ref|algorithm|critic|reward_model)\.[\w.]+)=([^\s'\",\]]+)"
_CONFIG_PATTERN = r"'(n_gpus_per_node|nnodes|max_response_length|max_prompt_length)':\s*(\d+)"
_THREE_DECIMALS = r"^-?\d+\.\d{3}$"
_REPR_ONLY = r"^(?:np|numpy)\.|^-?\d+$|^-?\d*\.?\d+[eE][+-]?\d+$|^-?\d+\.(?:\d{1,2}|\d{4,})$"


def _typed(text: str):
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    if re.fullmatch(r"-?\d*\.\d+(?:[eE][+-]?\d+)?", text):
        return float(text)
    return text.strip("'\"")


def verl_settings_from_lines(con: duckdb.DuckDBPyConnection, table: str, column: str) -> dict:
    """verl settings named in a log: Hydra overrides (`data.max_response_length=2048`) and, failing
    those, the pprinted resolved config. The last occurrence of a setting wins.

    Returns meta keys (`max_response_len`, `n_sampling`, `n_gpus_per_node`, `nnodes`, `model`, ...).
    """
    found = con.execute(
        f"""
        WITH hits AS (
            SELECT line_no, regexp_extract_all({column}, ?, 1) AS keys, regexp_extract_all({column}, ?, 2) AS vals
            FROM {table}
            WHERE contains({column}, '=') AND regexp_matches({column}, ?)
        )
        SELECT key, vals[idx] FROM (
            SELECT line_no, unnest(keys) AS key, unnest(range(1, len(keys) + 1)) AS idx, vals FROM hits)
        ORDER BY line_no, idx
        """,
        [_OVERRIDE_PATTERN, _OVERRIDE_PATTERN, _OVERRIDE_PATTERN],
    ).fetchall()
    settings: dict = {}
    for key, value in found:
        if key in VERL_OVERRIDES:
            settings[VERL_OVERRIDES[key]] = _typed(value)
    config = con.execute(
        f"""
        SELECT regexp_extract({column}, ?, 1), regexp_extract({column}, ?, 2)
        FROM {table} WHERE regexp_matches({column}, ?) ORDER BY line_no
        """,
        [_CONFIG_PATTERN, _CONFIG_PATTERN, _CONFIG_PATTERN],
    ).fetchall()
    from_config: dict = {}
    for key, value in config:
        from_config[VERL_CONFIG_KEYS[key]] = int(value)
    for key, value in from_config.items():
        settings.setdefault(key, value)
    return settings


def n_gpus_from_throughput(con: duckdb.DuckDBPyConnection, file_id: int) -> int | None:
    """GPUs of a verl run from its perf metrics, median over steps, rounded:

        n_gpus = perf/total_num_tokens / (perf/throughput × perf/time_per_step)

    (verl defines throughput as tokens per second per GPU). None when the keys are missing.
    """
    rows = con.execute(
        """
        WITH per_step AS (
            SELECT segment, step,
                   max(value) FILTER (WHERE key = 'perf/total_num_tokens') AS tokens,
                   max(value) FILTER (WHERE key = 'perf/throughput') AS throughput,
                   max(value) FILTER (WHERE key = 'perf/time_per_step') AS seconds
            FROM step_metrics WHERE file_id = ? GROUP BY segment, step
        )
        SELECT median(tokens / (throughput * seconds)) FROM per_step
        WHERE tokens > 0 AND throughput > 0 AND seconds > 0 AND isfinite(tokens / (throughput * seconds))
        """,
        [file_id],
    ).fetchall()
    estimate = rows[0][0] if rows else None
    return None if estimate is None else max(1, round(estimate))


def verl_console_version(con: duckdb.DuckDBPyConnection, table: str, column: str) -> tuple[str | None, float | None]:
    """(version class, value precision) from the printed value texts in `table.column`.

    verl up to 0.4 prints every value with `:.3f`, so when every finite numeric value has exactly
    three decimals the class is '<=0.4' and the precision 0.001. A numpy-wrapped value, a bare
    integer, exponent notation or another number of decimals is verl 0.5+'s repr: '>=0.5', precision
    None (full). No numeric values: (None, None).
    """
    three, repr_like = con.execute(
        f"""
        SELECT count(*) FILTER (WHERE regexp_matches(trim({column}), ?)),
               count(*) FILTER (WHERE regexp_matches(trim({column}), ?))
        FROM {table}
        """,
        [_THREE_DECIMALS, _REPR_ONLY],
    ).fetchall()[0]
    if repr_like:
        return ">=0.5", None
    if three:
        return "<=0.4", 0.001
    return None, None


def gpu_meta(settings: dict, from_throughput: int | None) -> dict:
    """`n_gpus` and where it came from: the perf metrics first, else nnodes × n_gpus_per_node."""
    if from_throughput:
        return {"n_gpus": from_throughput, "n_gpus_source": "perf/total_num_tokens / (perf/throughput * perf/time_per_step)"}
    per_node = settings.get("n_gpus_per_node")
    if isinstance(per_node, int):
        nodes = settings.get("nnodes") if isinstance(settings.get("nnodes"), int) else 1
        return {"n_gpus": per_node * nodes, "n_gpus_source": "trainer.nnodes * trainer.n_gpus_per_node"}
    return {}
