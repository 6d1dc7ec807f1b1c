"""How a run executed: its execution mode, decided from its config and the metric families it logged.

In an asynchronous trainer the rollout side and the trainer run side by side, joined by a queue, and the
logged timers mean something else than in a colocated (sync) run: verl's `timing_s/gen` is the trainer
*waiting* for a trainable batch (verl docs/advance/v1_async_trainer.md; fully_async_policy's
`trainer/idle_ratio` = timing_s/gen / timing_s/step), not generation. The modes:

    sync            colocated: generation, then training, on the same GPUs, one after the other
    one-step-off    verl's one_step_off_policy: the next batch is generated while the current one trains
                    (step ≈ wait_prev_gen + old_log_prob + update_actor, docs/advance/one_step_off.md)
    fully-async     verl's fully_async_policy (a rollouter and a trainer joined by a message queue with
                    a staleness limit), or any framework whose keys map to the asynchronous canonical
                    families (trainer_wait_s with rollout_s, the idle ratios, staleness)
    colocate-async  the V1 trainer's colocate_async (trainer.v1.trainer_mode)
    separate-async  the V1 trainer's separate_async: standalone rollout GPUs beside the trainer's
    async-grpo      TRL's AsyncGRPO (a rollout worker feeding the trainer through a bounded buffer)

Evidence, first that applies, each kept as a line of `execution_mode_evidence`:

1. config: run meta `trainer_mode` (trainer.v1.trainer_mode: colocate_async / separate_async / sync),
   `entrypoint` (python -m verl.experimental.fully_async_policy... / ...one_step_off_policy...),
   `staleness_threshold` (async_training.*: the fully async policy);
2. metric families (raw keys of the run's pairs, as each framework declares them in its names module's
   `EXECUTION_MODE_KEYS`, most specific first): verl's `timing_s/wait_prev_gen` → one-step-off;
   `timing_s/switch_*`, `training/off_policy/*` → separate-async; `fully_async/*`, `rollouter/*`,
   `trainer/idle_ratio` → fully-async; TRL's `rollout/score_wait_s`, `rollout/inflight` → async-grpo;
3. canonical families (keys their file's names map to them, `named_step_metrics`): trainer_wait_s, rollout_s,
   trainer_idle_ratio, rollout_idle_ratio, staleness_mean, staleness_max → fully-async;
4. otherwise sync, with the evidence "no asynchronous config key or metric family".

`WAIT_MODES` are the modes whose `timing_s/gen` is the trainer's wait (every asynchronous verl mode: in
one-step-off the trainer blocks in `gen` on the previous step's generation).
"""

from __future__ import annotations

from collections.abc import Callable

import duckdb

SYNC, ONE_STEP_OFF, FULLY_ASYNC = "sync", "one-step-off", "fully-async"
COLOCATE_ASYNC, SEPARATE_ASYNC, ASYNC_GRPO = "colocate-async", "separate-async", "async-grpo"
MODES = (SYNC, ONE_STEP_OFF, FULLY_ASYNC, COLOCATE_ASYNC, SEPARATE_ASYNC, ASYNC_GRPO)
ASYNC_MODES = MODES[1:]
# Modes in which verl's `timing_s/gen` is the trainer waiting for a batch, not generating.
WAIT_MODES = (ONE_STEP_OFF, FULLY_ASYNC, COLOCATE_ASYNC, SEPARATE_ASYNC)

_TRAINER_MODES = {"sync": SYNC, "colocate_async": COLOCATE_ASYNC, "separate_async": SEPARATE_ASYNC}
_ENTRYPOINTS = (("fully_async_policy", FULLY_ASYNC), ("one_step_off_policy", ONE_STEP_OFF))


_KEYS_SOURCE: Callable[[], dict[str, str]] | None = None


def hand_down(source: Callable[[], dict[str, str]]) -> None:
    """Make `source` the function the key families are asked from (the ingest registry hands down the
    formats' declarations when it loads; the semantics layer imports no layer above it)."""
    global _KEYS_SOURCE
    _KEYS_SOURCE = source


def key_families() -> dict[str, str]:
    """Key prefix -> mode, as the formats declare them (each framework's `EXECUTION_MODE_KEYS`, most
    specific first, handed down by the ingest registry); none before the registry is loaded."""
    return _KEYS_SOURCE() if _KEYS_SOURCE is not None else {}


# What each mode's timers mean, for `polytrace formats` and the docs: (how the mode is told, the timers).
MODE_TIMERS = {
    SYNC: ("no asynchronous key or family",
           "timing_s/gen is generation on every GPU; the step is generation + training + weight sync, one after "
           "the other"),
    ONE_STEP_OFF: ("python -m verl.experimental.one_step_off_policy..., timing_s/wait_prev_gen",
                   "timing_s/wait_prev_gen (older: timing_s/gen) is the trainer waiting for the previous step's "
                   "generation; timing_s/generate_sequences is the rollout's own generation of the batch, beside "
                   "training; timing_s/sync_rollout_weights is the weight sync, inside the step"),
    FULLY_ASYNC: ("python -m verl.experimental.fully_async_policy..., async_training.*, fully_async/*, "
                  "rollouter/*; or any framework's keys mapped to trainer_wait_s, rollout_s, the idle ratios or "
                  "staleness",
                  "timing_s/gen is the trainer waiting for enough samples; timing_s/param_sync is the weight sync, "
                  "timed after the step and added to its wall time; rollouter/active_time is the rollout's busy "
                  "time between two weight versions; trainer/idle_ratio = gen / step, rollouter/idle_ratio = "
                  "1 − active / version time (recomputed from the timers, not trusted)"),
    COLOCATE_ASYNC: ("trainer.v1.trainer_mode=colocate_async",
                     "timing_s/gen is the trainer waiting for a trainable batch (warm-up batches and partial "
                     "rollouts on the same GPUs)"),
    SEPARATE_ASYNC: ("trainer.v1.trainer_mode=separate_async, timing_s/switch_*, training/off_policy/*",
                     "timing_s/gen is the trainer waiting for the next trainable mini-batch; timing_s/update_weights "
                     "is the standalone rollout's weight sync; timing_s/switch_to_rollout and _to_trainer are the "
                     "hybrid GPUs' mode switches; training/off_policy/trajectory_staleness/* is the lag in model "
                     "versions"),
    ASYNC_GRPO: ("TRL rollout/score_wait_s, rollout/inflight, rollout/generated_tok_s",
                 "step_time is the trainer's step; rollout/score_wait_s is a group's wait to be scored, "
                 "rollout/inflight the requests generating, rollout/generated_tok_s the rollout's throughput"),
}
CANONICAL_FAMILIES = ("trainer_wait_s", "rollout_s", "trainer_idle_ratio", "rollout_idle_ratio", "staleness_mean",
                      "staleness_max")


def _families(con: duckdb.DuckDBPyConnection, run_id: int) -> tuple[list[str], list[str]]:
    """(the raw asynchronous family prefixes the run's pairs hold, the canonical families its keys map to):
    the run's distinct keys are tried on the prefixes and on the keys some format maps to a canonical
    family, and only the pairs of the keys found are named (a run holds tens of distinct keys, most runs
    none of these)."""
    prefixes = tuple(key_families())
    aliased = {key for (key,) in con.execute(
        "SELECT DISTINCT key FROM metric_aliases WHERE list_contains(?::VARCHAR[], canonical)",
        [list(CANONICAL_FAMILIES)]).fetchall()}
    run_keys = con.execute("SELECT DISTINCT key FROM step_metrics WHERE run_id = ?", [run_id]).fetchall()
    found = [key for (key,) in run_keys if key in aliased or key.startswith(prefixes)]
    if not found:
        return [], []
    keys = con.execute(
        "SELECT DISTINCT key, CASE WHEN list_contains(?::VARCHAR[], canonical) THEN canonical END"
        " FROM named_step_metrics WHERE run_id = ? AND list_contains(?::VARCHAR[], key)",
        [list(CANONICAL_FAMILIES), run_id, found]).fetchall()
    families = [prefix for prefix in prefixes if any(key.startswith(prefix) for key, _ in keys)]
    canonical = sorted({name for _, name in keys if name is not None})
    return families, canonical


def decide_mode(con: duckdb.DuckDBPyConnection, run_id: int, meta: dict) -> dict:
    """{'execution_mode': one of MODES, 'execution_mode_evidence': [lines]} by the rules of the module
    docstring."""
    evidence: list[str] = []
    mode = None
    told = meta.get("trainer_mode")
    if isinstance(told, str) and told in _TRAINER_MODES:
        mode = _TRAINER_MODES[told]
        evidence.append(f"config: trainer.v1.trainer_mode={told}")
    entry = meta.get("entrypoint")
    if isinstance(entry, str):
        for part, entry_mode in _ENTRYPOINTS:
            if part in entry:
                mode = mode or entry_mode
                evidence.append(f"config: started as python -m {entry}")
    if meta.get("staleness_threshold") is not None:
        mode = mode or FULLY_ASYNC
        evidence.append(f"config: async_training.staleness_threshold={meta['staleness_threshold']}")
    families, canonical = _families(con, run_id)
    declared = key_families()
    by_key = [declared[prefix] for prefix in families]
    for prefix in families:
        evidence.append(f"metrics: {prefix}{'*' if prefix.endswith(('/', '_')) else ''} logged")
    if mode is None and by_key:
        # The most specific family present decides (the declared order).
        mode = by_key[0]
    if canonical:
        evidence.append(f"canonical families: {', '.join(canonical)}")
        mode = mode or FULLY_ASYNC
    if mode is None:
        mode = SYNC
        evidence.append("no asynchronous config key or metric family: colocated, one phase after the other")
    return {"execution_mode": mode, "execution_mode_evidence": evidence}
