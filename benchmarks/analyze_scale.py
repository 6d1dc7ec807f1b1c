"""Analysis speed at scale: every registered analysis over 5 M samples and 1,000 steps.

Builds (once; reused when present) an on-disk store under benchmarks/out/analyze_scale/ with DuckDB SQL
generating rows straight into the tables:
  run `scale`    5,000,000 samples over 1,000 steps, 8 DP ranks, 8 responses per prompt, stored
                 as prompt groups (`sample_groups`, as packed-lengths traces are); prompt lengths
                 lognormal per prompt group, response lengths lognormal with a slow upward drift,
                 capped at 16,000 (cap recorded in runs.meta); reward timings per rank; DAPO dynamic
                 sampling: two generation batches per trainer step, each keeping the prompts whose
                 hash falls in the kept third;
  run `agent`    one multi-turn trajectory per prompt group of `scale` (its first response, 625,000
                 per-response rows in `sample_rows`): 1–4 turns with prompt, cached and completion
                 tokens and engine latency, one search call between turns (lognormal latency);
  run `console`  the same 1,000 steps as step aggregates (timing_s/* and response_length/*).
Lognormal draws use Box–Muller on hash-derived uniforms, exp(mean + sd·sqrt(−2 ln u1)·cos(2π u2)),
so the store is identical on every build.

Then runs every analysis' summary over the three runs in a child process and prints per-analysis and
total seconds, and that process' peak RSS, against the target (< 10 s total, < 2 GB).
Usage: python benchmarks/analyze_scale.py [--samples N] [--steps N] [--rebuild]
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "out" / "analyze_scale"
TARGET_SECONDS = 10.0
TARGET_RSS_MB = 2048
RANKS, N_SAMPLING, CAP = 8, 8, 16_000


def uniform(seed_sql: str, salt: int) -> str:
    """A deterministic uniform in (0, 1) from a hash of `seed_sql` and `salt`."""
    return f"((hash({seed_sql}, {salt}) % 4294967296)::DOUBLE + 0.5) / 4294967296.0"


def lognormal(seed_sql: str, salt: int, mean: str, sd: str) -> str:
    """exp(mean + sd·z) with z standard normal by Box–Muller."""
    z = f"sqrt(-2 * ln({uniform(seed_sql, salt)})) * cos(2 * pi() * {uniform(seed_sql, salt + 1)})"
    return f"exp({mean} + {sd} * {z})"


def build_store(path: Path, samples: int, steps: int) -> float:
    """Create the store; returns seconds spent."""
    sys.path.insert(0, str(HERE.parent))
    from polytrace_cli.store import open_store
    from polytrace_cli.ingest.registry import declared_metric_names

    started = time.perf_counter()
    con = open_store(path, metric_names=declared_metric_names)
    per_step = samples // steps
    per_rank = per_step // RANKS
    meta = json.dumps({"max_response_len": CAP, "n_sampling": N_SAMPLING})
    con.execute("INSERT INTO runs (run_id, name, framework, task, meta) VALUES (1, 'scale', 'synthetic', 'code', ?), "
                "(2, 'console', 'verl', 'code', '{}'), (3, 'agent', 'synthetic', 'search', ?)", [meta, meta])
    prompt = lognormal("i // 8", 1, "5.5", "0.5")
    response = lognormal("i", 3, f"7.0 + 0.0005 * (i // {per_step})", "1.0")
    con.execute(f"""
        INSERT INTO sample_groups (run_id, file_id, step, rank, dp_rank, tp_rank, prompt_idx, prompt_len, validate,
                                   response_lens)
        SELECT 1, 1, step, dp_rank, dp_rank, 0, prompt_idx, any_value(prompt_len), false,
               list(response_len ORDER BY i)
        FROM (
            SELECT i, (i // {per_step})::INTEGER AS step, ((i % {per_step}) // {per_rank})::INTEGER AS dp_rank,
                   ((i % {per_rank}) // {N_SAMPLING})::INTEGER AS prompt_idx,
                   greatest(1, round({prompt}))::INTEGER AS prompt_len,
                   least({CAP}, greatest(1, round({response})))::INTEGER AS response_len
            FROM range({per_step * steps}) t(i)
        )
        GROUP BY step, dp_rank, prompt_idx
    """)
    con.execute("""
        INSERT INTO rank_timings (run_id, file_id, step, rank, dp_rank, tp_rank, stage, seconds, batch_size, tokens, response_max)
        SELECT 1, 1, step, dp_rank, dp_rank, 0, 'reward', sum(response_len) / 20000.0, count(*), sum(response_len), max(response_len)
        FROM samples WHERE run_id = 1 GROUP BY step, dp_rank
    """)
    con.execute(f"""
        INSERT INTO sample_rows (run_id, file_id, step, rank, dp_rank, tp_rank, prompt_idx, sample_idx, prompt_len,
                                 response_len, validate, turns, tool_calls, finish_reason)
        SELECT 3, 3, step, rank, dp_rank, tp_rank, prompt_idx, 0, prompt_len, response_len, false,
               1 + hash(step, dp_rank, prompt_idx, 11) % 4, hash(step, dp_rank, prompt_idx, 11) % 4,
               CASE WHEN response_len >= {CAP} THEN 'length' ELSE 'stop' END
        FROM samples WHERE run_id = 1 AND sample_idx = 0
    """)
    con.execute("""
        INSERT INTO turns (run_id, file_id, step, rank, prompt_idx, sample_idx, turn, prompt_tokens, cached_tokens,
                           completion_tokens, engine_latency_s, finish_reason, tool_call_count)
        SELECT 3, 3, step, dp_rank, prompt_idx, 0, t.turn, prompt_len + 300 * t.turn,
               CASE WHEN t.turn = 0 THEN 0 ELSE prompt_len + 250 * t.turn END,
               response_len // turns, response_len / turns / 2000.0,
               CASE WHEN t.turn = turns - 1 THEN finish_reason END, (t.turn < turns - 1)::INTEGER
        FROM samples, LATERAL (SELECT unnest(range(turns)) AS turn) t
        WHERE run_id = 3 AND turns IS NOT NULL
    """)
    latency = lognormal("step * 100000 + rank * 1000 + prompt_idx * 10 + turn", 21, "-2.0", "1.0")
    con.execute(f"""
        INSERT INTO tool_calls (run_id, file_id, step, rank, prompt_idx, sample_idx, turn, tool_name, latency_s,
                                status, query_count, response_tokens)
        SELECT 3, 3, step, rank, prompt_idx, 0, turn, 'search', {latency},
               CASE WHEN hash(step, rank, prompt_idx, turn, 31) % 50 = 0 THEN 'error' ELSE 'success' END, 1, 300
        FROM turns WHERE run_id = 3 AND tool_call_count = 1
    """)
    con.execute("""
        INSERT INTO filter_batches (run_id, file_id, workload_step, trainer_step, gen_batch_index, prompt_count,
                                    n_sampling, train_batch_size, num_prompt_in_batch_before, kept, used,
                                    kept_indices, used_indices)
        WITH p AS (
            SELECT step, dense_rank() OVER (PARTITION BY step ORDER BY dp_rank, prompt_idx) - 1 AS position
            FROM (SELECT DISTINCT step, dp_rank, prompt_idx FROM samples WHERE run_id = 1)
        ), b AS (
            SELECT step, count(*) AS prompt_count,
                   list(position ORDER BY position) FILTER (WHERE hash(step, position, 41) % 3 = 0) AS kept_indices
            FROM p GROUP BY step
        )
        SELECT 1, 1, step, step // 2 + 1, step % 2 + 1, prompt_count, 8, prompt_count // 2, 0,
               len(kept_indices), len(kept_indices) // 2 + 1, kept_indices, kept_indices[1:len(kept_indices) // 2 + 1]
        FROM b
    """)
    keys = {"timing_s/gen": "40 + mean_len / 50", "timing_s/reward": "5 + mean_len / 500",
            "timing_s/old_log_prob": "8", "timing_s/ref": "7", "timing_s/adv": "0.5", "timing_s/update_actor": "30",
            "timing_s/step": "91 + mean_len / 50 + mean_len / 500",
            "response_length/mean": "mean_len", "response_length/max": "max_len", "response_length/min": "min_len",
            "response_length/clip_ratio": "clip"}
    selects = " UNION ALL ".join(f"SELECT step, '{key}' AS key, ({expr})::DOUBLE AS value FROM agg" for key, expr in keys.items())
    con.execute(f"""
        INSERT INTO step_metrics (run_id, segment, step, key, value, file_id, line_no)
        WITH agg AS (
            SELECT step, avg(response_len) AS mean_len, max(response_len) AS max_len, min(response_len) AS min_len,
                   avg((response_len >= {CAP})::DOUBLE) AS clip
            FROM samples WHERE run_id = 1 GROUP BY step
        )
        SELECT 2, 0, step, key, value, 2, step + 1 FROM ({selects})
    """)
    con.close()
    return time.perf_counter() - started


def run_analyses(path: Path) -> None:
    """Child process: time every registered analysis; print one JSON line of results."""
    sys.path.insert(0, str(HERE.parent))
    from polytrace_cli.analyze.common import StepRange
    from polytrace_cli.analyze.registry import all_analyses
    from polytrace_cli.store import open_store
    from polytrace_cli.ingest.registry import declared_metric_names

    con = open_store(path, read_only=True, metric_names=declared_metric_names)
    ids = [row[0] for row in con.execute("SELECT run_id FROM runs ORDER BY run_id").fetchall()]
    timings = {}
    for name, analysis in all_analyses().items():
        started, cpu = time.perf_counter(), time.process_time()
        rows = analysis.summary(con, ids, StepRange()).height
        timings[name] = {"seconds": time.perf_counter() - started, "cpu_seconds": time.process_time() - cpu, "rows": rows}
    con.close()
    print(json.dumps({"timings": timings, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=5_000_000)
    parser.add_argument("--steps", type=int, default=1_000)
    parser.add_argument("--rebuild", action="store_true", help="Rebuild the store even when present.")
    parser.add_argument("--analyze-only", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.analyze_only:
        run_analyses(args.analyze_only)
        return 0

    store = OUT / f"store_v3_{args.samples}_{args.steps}.duckdb"
    if args.rebuild and OUT.exists():
        shutil.rmtree(OUT)
    OUT.mkdir(parents=True, exist_ok=True)
    if not store.exists():
        seconds = build_store(store, args.samples, args.steps)
        print(f"built {store.name}: {args.samples:,} samples, {args.steps:,} steps in {seconds:.1f} s")
    else:
        print(f"reusing {store.name} (--rebuild to regenerate)")

    child = subprocess.run([sys.executable, __file__, "--analyze-only", str(store)], capture_output=True, text=True)
    if child.returncode != 0:
        sys.stderr.write(child.stderr)
        return 1
    result = json.loads(child.stdout.strip().splitlines()[-1])
    total = sum(t["seconds"] for t in result["timings"].values())
    cpu_total = sum(t["cpu_seconds"] for t in result["timings"].values())
    print(f"\n{'analysis':<12} {'seconds':>8} {'cpu s':>8} {'rows':>6}")
    for name, timing in result["timings"].items():
        print(f"{name:<12} {timing['seconds']:>8.2f} {timing['cpu_seconds']:>8.2f} {timing['rows']:>6}")
    print(f"{'total':<12} {total:>8.2f} {cpu_total:>8.2f}")
    print("(cpu s: the process' CPU seconds over all its threads; above wall seconds when DuckDB runs in parallel,"
          " below when other work shares the cores)")
    rss = result["peak_rss_mb"]
    print(f"\ntotal {total:.2f} s (target < {TARGET_SECONDS:.0f} s): {'met' if total < TARGET_SECONDS else 'MISSED'}")
    print(f"peak RSS {rss:,.0f} MB (target < {TARGET_RSS_MB:,} MB): {'met' if rss < TARGET_RSS_MB else 'MISSED'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
