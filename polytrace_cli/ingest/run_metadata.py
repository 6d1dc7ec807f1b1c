"""Run metadata read from a log's content: framework version class, precision, GPUs, config.

Ingesters call these on their temporary tables and put the results in `ctx.run_meta`, which the
runner merges into `runs.meta` (later files add keys; a key already set is overwritten only by a
non-null value). A null is dropped, except for the keys of `NULL_MEANS_CANNOT_TELL`, where it is
stored when no file has decided the key: the run was looked at and cannot tell.
"""

from __future__ import annotations

import ast
import re

import duckdb

from polytrace_cli.store.sql import fold_added_rows

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
    "trainer.balance_batch": "balance_batch",
    # Asynchronous trainers: the V1 trainer's mode (docs/advance/v1_async_trainer.md), the fully async
    # policy's staleness limit, partial rollouts and weight-sync period (docs/advance/fully_async.md), and
    # the rollout side's own GPUs.
    "trainer.v1.trainer_mode": "trainer_mode",
    "trainer.v1.sampler.max_off_policy_threshold": "max_off_policy_threshold",
    "async_training.staleness_threshold": "staleness_threshold",
    "async_training.partial_rollout": "partial_rollout",
    "async_training.trigger_parameter_sync_step": "trigger_parameter_sync_step",
    "rollout.n_gpus_per_node": "rollout_n_gpus_per_node",
    "rollout.nnodes": "rollout_nnodes",
    "actor_rollout_ref.rollout.n_gpus_per_node": "rollout_n_gpus_per_node",
    "actor_rollout_ref.rollout.nnodes": "rollout_nnodes",
}
# Overrides whose value is a switch (`trainer.balance_batch=False`): stored as true / false.
VERL_SWITCHES = frozenset({"balance_batch", "partial_rollout"})
# The module a verl job was started with (`python3 -m verl.experimental.fully_async_policy.fully_async_main`):
# the meta key `entrypoint`, which tells an asynchronous recipe from the colocated trainer.
_ENTRYPOINT = re.compile(r"-m\s+(verl\.[\w.]+)")
# The same settings as printed by verl's pprint of its resolved config (`'max_response_length': 1024`);
# used only when no command-line override names them. `rollout.n` is not among them: `'n'` is ambiguous.
VERL_CONFIG_KEYS: dict[str, str] = {
    "n_gpus_per_node": "n_gpus_per_node",
    "nnodes": "nnodes",
    "max_response_length": "max_response_len",
    "max_prompt_length": "max_prompt_len",
}

# A line that may name a setting (cheap to test on every line of a log).
VERL_SETTINGS_LINE = (r"(?:trainer|data|actor_rollout_ref|algorithm|critic|reward_model|async_training|rollout)\.[\w.]+="
                      r"|'(?:n_gpus_per_node|nnodes|max_response_length|max_prompt_length)':|-m\s+verl\.")
_OVERRIDE = re.compile(r"(?:^|[\s'\"\[,+])((?:trainer|data|actor_rollout_ref|algorithm|critic|reward_model|async_training"
                       r"|rollout)\.[\w.]+)"
                       r"=([^\s'\",\]]+)")
_CONFIG = re.compile(r"'(n_gpus_per_node|nnodes|max_response_length|max_prompt_length)':\s*(\d+)")
_THREE_DECIMALS = re.compile(r"^-?\d+\.\d{3}$")


# `$MODEL_PATH`, `${MODEL_PATH}`, `${oc.env:X}`: a variable the log printed unexpanded, not a value.
_SHELL_VARIABLE = re.compile(r"\$\{?[A-Za-z_]")


def is_shell_variable(text: str) -> bool:
    """True when a printed setting value holds an unexpanded shell or OmegaConf variable."""
    return bool(_SHELL_VARIABLE.search(text))


def _typed(text: str):
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    if re.fullmatch(r"-?\d*\.\d+(?:[eE][+-]?\d+)?", text):
        return float(text)
    return text.strip("'\"")


def _switch(text: str) -> bool | None:
    """A printed switch value (`True`, `false`, `1`) as a bool; None when it is not one."""
    return {"true": True, "false": False, "1": True, "0": False}.get(text.strip("'\"").lower())


def verl_settings(lines: list[str]) -> dict:
    """verl settings named in a log's lines: Hydra overrides (`data.max_response_length=2048`)
    and, for settings no override names, the pprinted resolved config (`'max_response_length':
    2048`). The last occurrence of a setting wins.

    Returns meta keys (`max_response_len`, `n_sampling`, `n_gpus_per_node`, `nnodes`, `model`, ...).
    """
    settings: dict = {}
    from_config: dict = {}
    for line in lines:
        for key, value in _OVERRIDE.findall(line):
            if key in VERL_OVERRIDES and not is_shell_variable(value):
                name = VERL_OVERRIDES[key]
                switch = _switch(value) if name in VERL_SWITCHES else None
                if name not in VERL_SWITCHES:
                    settings[name] = _typed(value)
                elif switch is not None:
                    settings[name] = switch
        for key, value in _CONFIG.findall(line):
            from_config[VERL_CONFIG_KEYS[key]] = int(value)
        entry = _ENTRYPOINT.search(line)
        if entry:
            settings["entrypoint"] = entry[1]
    for key, value in from_config.items():
        settings.setdefault(key, value)
    return settings


# Settings read from the config dict verl prints at start (a pprint of the resolved OmegaConf
# config): meta key -> path of keys in the dict. These win over command-line overrides, which a
# launch script may echo before its variables are expanded.
VERL_CONFIG_PATHS: dict[str, tuple[str, ...]] = {
    "model": ("actor_rollout_ref", "model", "path"),
    "adv_estimator": ("algorithm", "adv_estimator"),
    "project_name": ("trainer", "project_name"),
    "experiment_name": ("trainer", "experiment_name"),
    "n_sampling": ("actor_rollout_ref", "rollout", "n"),
    "train_batch_size": ("data", "train_batch_size"),
}
# Switches read from the same dict, kept only when they are true or false.
VERL_CONFIG_SWITCHES: dict[str, tuple[str, ...]] = {"balance_batch": ("trainer", "balance_batch")}
# The first line of that pprint, once cleaned: a dict opening on one of verl's top-level keys.
VERL_CONFIG_START = r"^\{'(?:actor_rollout_ref|algorithm|critic|data|reward_model|trainer)': "
_CONFIG_BLOCK_MAX_LINES = 5000
_STRING_LITERAL = re.compile(r"'(?:[^'\\\n]|\\.)*'|\"(?:[^\"\\\n]|\\.)*\"")


def verl_config_block(lines: list[str]) -> dict | None:
    """The config dict verl pprints at start, from its cleaned lines starting at the dict's first
    line: lines are taken until the brackets (outside string literals) balance, joined by newlines
    (pprint splits long strings into adjacent literals) and read with `ast.literal_eval`.
    None when the block never closes or is not a literal dict."""
    depth, taken = 0, []
    for line in lines[:_CONFIG_BLOCK_MAX_LINES]:
        taken.append(line)
        bare = _STRING_LITERAL.sub("", line)
        depth += sum(bare.count(c) for c in "{[(") - sum(bare.count(c) for c in "}])")
        if depth <= 0:
            break
    if depth:
        return None
    try:
        value = ast.literal_eval("\n".join(taken))
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


_CONFIG_SCALAR = re.compile(r"'(adv_estimator|project_name|experiment_name)':\s*'([^'\n]*)'")


def verl_config_from_lines(lines: list[str]) -> dict:
    """Meta keys from a printed verl config whose first line is `lines[0]`: read from the dict
    when it parses (`verl_config_block`), else from the keys that name one setting wherever they
    appear (`adv_estimator`, `project_name`, `experiment_name`) in the block's lines; the model
    path is only taken from a parsed dict, since several sections have a `path`."""
    config = verl_config_block(lines)
    if config is not None:
        return verl_config_settings(config)
    found = {}
    for line in lines[:_CONFIG_BLOCK_MAX_LINES]:
        for key, value in _CONFIG_SCALAR.findall(line):
            if value.strip() and not is_shell_variable(value):
                found.setdefault(key, value)
    return found


def verl_config_settings(config: dict) -> dict:
    """Meta keys (`VERL_CONFIG_PATHS`) found in a printed verl config dict; text values holding
    an unexpanded variable are left out."""
    found = {}
    for meta_key, path in VERL_CONFIG_PATHS.items():
        value = config
        for part in path:
            value = value.get(part) if isinstance(value, dict) else None
        if isinstance(value, (str, int, float)) and not isinstance(value, bool) \
                and not (isinstance(value, str) and (not value.strip() or is_shell_variable(value))):
            found[meta_key] = value
    for meta_key, path in VERL_CONFIG_SWITCHES.items():
        value = config
        for part in path:
            value = value.get(part) if isinstance(value, dict) else None
        if isinstance(value, bool):
            found[meta_key] = value
    return found


def crash_after_last_step(texts: list[str]) -> str | None:
    """The fatal error a log ends with (`crashes.first_crash`: a traceback's final line, OOM, an NCCL
    timeout, a dead Ray task or actor, a signal; never a warning, a retry, an `Exception ignored in:`
    block or a config entry) among the lines after its last metric line (`texts`, in order), cut to
    160 characters; None without one."""
    from polytrace_cli.ingest.crashes import first_crash

    crash = first_crash(texts)
    return crash.reason[:160] if crash is not None else None


# OpenRLHF command-line flags (`--n_samples_per_prompt 8` or `--n_samples_per_prompt=8`) and the meta
# key each one fills.
OPENRLHF_FLAGS: dict[str, str] = {
    "actor_num_nodes": "nnodes",
    "actor_num_gpus_per_node": "n_gpus_per_node",
    "n_samples_per_prompt": "n_sampling",
    "generate_max_len": "max_response_len",
    "prompt_max_len": "max_prompt_len",
    "rollout_batch_size": "train_batch_size",
    "pretrain": "model",
    "advantage_estimator": "adv_estimator",
    "vllm_num_engines": "vllm_num_engines",
    "vllm_tensor_parallel_size": "vllm_tensor_parallel_size",
}
OPENRLHF_SETTINGS_LINE = r"--(?:" + "|".join(OPENRLHF_FLAGS) + r")[\s=]"
_OPENRLHF_FLAG = re.compile(r"--(" + "|".join(OPENRLHF_FLAGS) + r")(?:\s+|=)([^\s'\",\]\\]+)")


def openrlhf_settings(lines: list[str]) -> dict:
    """OpenRLHF settings named on a command line in the log (`--actor_num_gpus_per_node 8`, ...),
    the last occurrence winning, plus `n_gpus` = actor_num_nodes × actor_num_gpus_per_node (the
    actor's GPUs; nodes default to 1) when the per-node count is named."""
    settings: dict = {}
    for line in lines:
        for flag, value in _OPENRLHF_FLAG.findall(line):
            if not is_shell_variable(value):
                settings[OPENRLHF_FLAGS[flag]] = _typed(value)
    per_node = settings.get("n_gpus_per_node")
    if isinstance(per_node, int):
        nodes = settings.get("nnodes") if isinstance(settings.get("nnodes"), int) else 1
        settings["n_gpus"] = per_node * nodes
        settings["n_gpus_source"] = "--actor_num_nodes * --actor_num_gpus_per_node"
    return settings


# The perf metrics the GPU count is estimated from, and the temporary tables keeping their largest
# value per step of each file estimated and what they were read from (`n_gpus_from_throughput`).
PERF_KEYS = ("perf/total_num_tokens", "perf/throughput", "perf/time_per_step")
_PERF_STEPS = "gpu_count_perf_steps"
_PERF_STEPS_MADE_FROM = "gpu_count_perf_steps_made_from"


def n_gpus_from_throughput(con: duckdb.DuckDBPyConnection, file_id: int) -> int | None:
    """GPUs of a verl run from its perf metrics, median over steps, rounded:

        n_gpus = perf/total_num_tokens / (perf/throughput × perf/time_per_step)

    (verl defines throughput as tokens per second per GPU). None when the keys are missing.
    The file's per-step perf values are kept for its next estimate (`_perf_steps`).
    """
    _perf_steps(con, file_id)
    rows = con.execute(
        f"""
        SELECT median(tokens / (throughput * seconds)) FROM {_PERF_STEPS}
        WHERE file_id = ? AND tokens > 0 AND throughput > 0 AND seconds > 0
          AND isfinite(tokens / (throughput * seconds))
        """, [file_id]).fetchall()
    estimate = rows[0][0] if rows else None
    return None if estimate is None else max(1, round(estimate))


def _perf_step_sql(later: bool) -> str:
    """The largest value of each perf key per step of file $1 (on lines after $2 when `later`)."""
    picked = ", ".join(f"max(value) FILTER (WHERE key = '{key}') AS {name}"
                       for key, name in zip(PERF_KEYS, ("tokens", "throughput", "seconds")))
    keys = ", ".join(f"'{key}'" for key in PERF_KEYS)
    return (f"SELECT file_id, segment, step, {picked} FROM step_metrics WHERE file_id = $1 AND key IN ({keys})"
            f"{' AND line_no > $2' if later else ''} GROUP BY file_id, segment, step")


def _perf_steps(con: duckdb.DuckDBPyConnection, file_id: int) -> None:
    """Bring the file's rows of the temporary table of per-step perf values up to date with its
    pairs: kept per file estimated, with the pairs they were read from; a file that only gained
    pairs on later lines since (a log that grew: a file's pairs are only ever added to, or removed
    with it) has the steps of its new pairs combined in (the largest of the kept and the new values),
    else its rows are read whole. A temporary table follows the transaction that changed it."""
    pairs, last_line = con.execute("SELECT count(*), max(line_no) FROM step_metrics WHERE file_id = ?",
                                   [file_id]).fetchall()[0]
    con.execute(f"CREATE TEMP TABLE IF NOT EXISTS {_PERF_STEPS} (file_id BIGINT, segment INTEGER, step BIGINT,"
                " tokens DOUBLE, throughput DOUBLE, seconds DOUBLE)")
    con.execute(f"CREATE TEMP TABLE IF NOT EXISTS {_PERF_STEPS_MADE_FROM} (file_id BIGINT, pairs BIGINT,"
                " last_line BIGINT)")
    made = con.execute(f"SELECT pairs, last_line FROM {_PERF_STEPS_MADE_FROM} WHERE file_id = ?",
                       [file_id]).fetchall()
    if made and made[0] == (pairs, last_line):
        return
    grew = bool(made) and made[0][1] is not None and pairs > made[0][0] \
        and con.execute("SELECT count(*) FROM step_metrics WHERE file_id = ? AND line_no > ?",
                        [file_id, made[0][1]]).fetchall()[0][0] == pairs - made[0][0]
    if grew:
        con.execute(f"CREATE OR REPLACE TEMP TABLE gpu_count_perf_added AS {_perf_step_sql(True)}",
                    [file_id, made[0][1]])
        fold_added_rows(con, _PERF_STEPS, "gpu_count_perf_added", ("file_id", "segment", "step"),
                        "file_id, segment, step",
                        "max(tokens) AS tokens, max(throughput) AS throughput, max(seconds) AS seconds")
    else:
        con.execute(f"DELETE FROM {_PERF_STEPS} WHERE file_id = ?", [file_id])
        con.execute(f"INSERT INTO {_PERF_STEPS} {_perf_step_sql(False)}", [file_id])
    if made:
        con.execute(f"UPDATE {_PERF_STEPS_MADE_FROM} SET pairs = ?, last_line = ? WHERE file_id = ?",
                    [pairs, last_line, file_id])
    else:
        con.execute(f"INSERT INTO {_PERF_STEPS_MADE_FROM} VALUES (?, ?, ?)", [file_id, pairs, last_line])


def verl_console_version(value_texts: list[str]) -> tuple[str | None, float | None]:
    """(version class, value precision) from printed texts of finite numeric values.

    verl up to 0.4 prints every value with `:.3f`, so when every text has exactly three decimals
    the class is '<=0.4' and the precision 0.001. Anything else (a numpy-wrapped value, a bare
    integer, exponent notation, another number of decimals) is verl 0.5+'s repr: ('>=0.5', None),
    full precision. No texts: (None, None).
    """
    if not value_texts:
        return None, None
    if all(_THREE_DECIMALS.match(text.strip()) for text in value_texts):
        return "<=0.4", 0.001
    return ">=0.5", None


# The run meta a verl log's read computes from the file's or run's stored rows (`gpu_meta` of
# `n_gpus_from_throughput`, `semantics.step_timers.step_time_inclusion`): an appended read gives it as a
# whole read would, so it may change from one read to the next (`recomputed_meta`).
VERL_META_FROM_STORED_ROWS = frozenset({"n_gpus", "n_gpus_source", "step_time_includes_testing",
                                        "step_time_includes_checkpoint"})


def gpu_meta(settings: dict, from_throughput: int | None) -> dict:
    """`n_gpus` and where it came from: the perf metrics first, else nnodes × n_gpus_per_node."""
    if from_throughput:
        return {"n_gpus": from_throughput, "n_gpus_source": "perf/total_num_tokens / (perf/throughput * perf/time_per_step)"}
    per_node = settings.get("n_gpus_per_node")
    if isinstance(per_node, int):
        nodes = settings.get("nnodes") if isinstance(settings.get("nnodes"), int) else 1
        return {"n_gpus": per_node * nodes, "n_gpus_source": "trainer.nnodes * trainer.n_gpus_per_node"}
    return {}
