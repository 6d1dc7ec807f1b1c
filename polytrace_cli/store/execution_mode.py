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
2. metric families (raw keys of the run's pairs): `timing_s/wait_prev_gen` → one-step-off;
   `fully_async/*`, `rollouter/*`, `trainer/idle_ratio` → fully-async; `training/off_policy/*` with
   `timing_s/switch_*` → separate-async; `rollout/score_wait_s`, `rollout/inflight` → async-grpo;
3. canonical families (any framework that maps its keys to them): trainer_wait_s, rollout_s,
   trainer_idle_ratio, rollout_idle_ratio, staleness_mean, staleness_max → fully-async;
4. otherwise sync, with the evidence "no asynchronous config key or metric family".

`WAIT_MODES` are the modes whose `timing_s/gen` is the trainer's wait (every asynchronous verl mode: in
one-step-off the trainer blocks in `gen` on the previous step's generation).
"""

from __future__ import annotations

import duckdb

SYNC, ONE_STEP_OFF, FULLY_ASYNC = "sync", "one-step-off", "fully-async"
COLOCATE_ASYNC, SEPARATE_ASYNC, ASYNC_GRPO = "colocate-async", "separate-async", "async-grpo"
MODES = (SYNC, ONE_STEP_OFF, FULLY_ASYNC, COLOCATE_ASYNC, SEPARATE_ASYNC, ASYNC_GRPO)
ASYNC_MODES = MODES[1:]
# Modes in which verl's `timing_s/gen` is the trainer waiting for a batch, not generating.
WAIT_MODES = (ONE_STEP_OFF, FULLY_ASYNC, COLOCATE_ASYNC, SEPARATE_ASYNC)

_TRAINER_MODES = {"sync": SYNC, "colocate_async": COLOCATE_ASYNC, "separate_async": SEPARATE_ASYNC}
_ENTRYPOINTS = (("fully_async_policy", FULLY_ASYNC), ("one_step_off_policy", ONE_STEP_OFF))
# Raw key prefixes of each framework's asynchronous families, most specific first.
_KEY_FAMILIES = (
    ("timing_s/wait_prev_gen", ONE_STEP_OFF),
    ("timing_s/sync_rollout_weights", ONE_STEP_OFF),
    ("timing_s/switch_", SEPARATE_ASYNC),
    ("fully_async/", FULLY_ASYNC),
    ("rollouter/", FULLY_ASYNC),
    ("trainer/idle_ratio", FULLY_ASYNC),
    ("timing_s/param_sync", FULLY_ASYNC),
    ("training/off_policy/", SEPARATE_ASYNC),
    ("rollout/score_wait_s", ASYNC_GRPO),
    ("rollout/inflight", ASYNC_GRPO),
    ("rollout/generated_tok_s", ASYNC_GRPO),
)
CANONICAL_FAMILIES = ("trainer_wait_s", "rollout_s", "trainer_idle_ratio", "rollout_idle_ratio", "staleness_mean",
                      "staleness_max")


def _families(con: duckdb.DuckDBPyConnection, run_id: int) -> tuple[list[str], list[str]]:
    """(the raw asynchronous family prefixes the run's pairs hold, the canonical families its keys map to),
    from one pass over the run's pairs (their distinct keys of those families)."""
    prefixes = [prefix for prefix, _ in _KEY_FAMILIES]
    aliased = dict(con.execute("SELECT key, canonical FROM metric_aliases WHERE canonical IN (SELECT unnest(?))",
                               [list(CANONICAL_FAMILIES)]).fetchall())
    tests = " OR ".join(f"starts_with(key, ${i + 2})" for i in range(len(prefixes)))
    keys = [row[0] for row in con.execute(
        f"SELECT DISTINCT key FROM step_metrics WHERE run_id = $1 AND ({tests} OR key IN (SELECT unnest(${len(prefixes) + 2})))",
        [run_id, *prefixes, list(aliased)]).fetchall()]
    families = [prefix for prefix in prefixes if any(key.startswith(prefix) for key in keys)]
    canonical = sorted({aliased[key] for key in keys if key in aliased})
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
    by_key = [next(m for p, m in _KEY_FAMILIES if p == prefix) for prefix in families]
    for prefix in families:
        evidence.append(f"metrics: {prefix}{'*' if prefix.endswith(('/', '_')) else ''} logged")
    if mode is None and by_key:
        # The most specific family present decides (the order of _KEY_FAMILIES).
        mode = next(m for p, m in _KEY_FAMILIES if p in families)
    if canonical:
        evidence.append(f"canonical families: {', '.join(canonical)}")
        mode = mode or FULLY_ASYNC
    if mode is None:
        mode = SYNC
        evidence.append("no asynchronous config key or metric family: colocated, one phase after the other")
    return {"execution_mode": mode, "execution_mode_evidence": evidence}
