"""Multi-rank PyTorch profiler (Kineto) traces of RL training steps, generated with known truth.

One file per rank, `actor_rank<r>-of-<world>_pid<pid>_<stamp>.json` (verl's file names), laid out as
torch's Kineto exporter writes them: the object format with `schemaVersion`, `deviceProperties`,
`distributedInfo` first, the event array, and `baseTimeNanoseconds` after it; `ts` µs after it. Per
step, three `record_function` ranges (`actor_compute_log_prob`, `ref_compute_log_prob`,
`actor_update`, cat `user_annotation`) on the main thread, each launching kernels: per kernel a
`cpu_op` (`aten::mm`), a `cuda_runtime` `cudaLaunchKernel` with `args.correlation`, and the `kernel`
on stream 7 of the rank's GPU with the same correlation (whole µs, as Kineto wrote them before its
ns timestamps: Holistic Trace Analysis reads `ts` and `dur` as integers, so fractional µs would
bias its numbers, not the comparison's); each range's GPU side is a
`gpu_user_annotation` on that stream from its first kernel's start to its last kernel's end. Rank r's
kernels are (1 + 0.1·r) times longer, so the last rank is the straggler.

`write_trace_set` returns the truth: per rank, the GPU idle time (first kernel start to last kernel
end, less the union of the kernels), the GPU time per stage (Σ of its `gpu_user_annotation`
durations) and the kernel time per stage.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path

STAGES = ("actor_compute_log_prob", "ref_compute_log_prob", "actor_update")
BASE_NS = 1_790_000_000_000_000_000
BYTES_PER_KERNEL = 480  # the three events of one kernel, as written below


@dataclass
class Truth:
    gpu_idle_us: dict[int, float] = field(default_factory=dict)
    gpu_stage_us: dict[tuple[int, str], float] = field(default_factory=dict)
    kernel_stage_us: dict[tuple[int, str], float] = field(default_factory=dict)
    files: list[Path] = field(default_factory=list)
    bytes: int = 0


def write_trace_set(folder: Path, megabytes: float, ranks: int = 4, kernels_per_stage: int = 200,
                    seed: int = 0) -> Truth:
    """Write `ranks` trace files of about `megabytes` MB together under `folder`; return their truth."""
    folder.mkdir(parents=True, exist_ok=True)
    truth = Truth()
    kernels_per_rank = int(megabytes * 1e6 / ranks / BYTES_PER_KERNEL)
    steps = max(1, kernels_per_rank // (kernels_per_stage * len(STAGES)))
    for rank in range(ranks):
        rng = random.Random(seed * 1000 + rank)
        pid = 4000 + rank
        path = folder / f"actor_rank{rank}-of-{ranks}_pid{pid}_20261201000000000.json"
        truth.files.append(path)
        slow = 1 + 0.1 * rank
        with open(path, "w") as out:
            out.write('{\n  "schemaVersion": 1,\n  "deviceProperties": [{"id": 0, "name": "NVIDIA H100", '
                      '"totalGlobalMem": 85000000000, "computeMajor": 9, "computeMinor": 0, "numSms": 132}],\n'
                      f'  "distributedInfo": {{"backend": "nccl", "rank": {rank}, "world_size": {ranks}}},\n'
                      '  "traceEvents": [\n')
            head = [f'{{"ph": "M", "name": "process_name", "pid": {pid}, "tid": 0, "args": {{"name": "python"}}}}',
                    f'{{"ph": "M", "name": "thread_name", "pid": {pid}, "tid": {pid}, "args": {{"name": "thread {pid} (python)"}}}}',
                    '{"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": "GPU 0"}}',
                    '{"ph": "M", "name": "thread_name", "pid": 0, "tid": 7, "args": {"name": "stream 7"}}']
            out.write(",\n".join(head))
            cpu = 1000.0
            gpu_free = 0.0
            correlation = 0
            intervals: list[tuple[float, float]] = []
            for step in range(steps):
                for stage in STAGES:
                    start = cpu
                    first_kernel = last_end = None
                    kernel_sum = 0.0
                    lines = []
                    for _ in range(kernels_per_stage):
                        correlation += 1
                        launch = cpu + 2.0
                        lines.append(f'{{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": {pid}, "tid": {pid}, '
                                     f'"ts": {cpu:.3f}, "dur": 9.0, "args": {{"External id": {correlation}}}}}')
                        lines.append(f'{{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": {pid}, '
                                     f'"tid": {pid}, "ts": {launch:.3f}, "dur": 4.0, '
                                     f'"args": {{"correlation": {correlation}, "External id": {correlation}}}}}')
                        duration = float(round(rng.uniform(5.0, 40.0) * slow))
                        begin = max(launch + 5.0, gpu_free + rng.choice((0.0, 0.0, 2.0, 12.0)))
                        end = begin + duration
                        gpu_free = end
                        lines.append(f'{{"ph": "X", "cat": "kernel", "name": "sm90_xmma_gemm", "pid": 0, "tid": 7, '
                                     f'"ts": {begin:.3f}, "dur": {duration:.3f}, '
                                     f'"args": {{"device": 0, "stream": 7, "correlation": {correlation}}}}}')
                        intervals.append((begin, end))
                        first_kernel = begin if first_kernel is None else first_kernel
                        last_end = end
                        kernel_sum += duration
                        cpu += 10.0
                    cpu += 5.0
                    lines.append(f'{{"ph": "X", "cat": "user_annotation", "name": "{stage}", "pid": {pid}, "tid": {pid}, '
                                 f'"ts": {start:.3f}, "dur": {cpu - start:.3f}, "args": {{"External id": 0}}}}')
                    span = round(last_end - first_kernel, 3)
                    lines.append(f'{{"ph": "X", "cat": "gpu_user_annotation", "name": "{stage}", "pid": 0, "tid": 7, '
                                 f'"ts": {first_kernel:.3f}, "dur": {span:.3f}, "args": {{"device": 0, "stream": 7}}}}')
                    out.write(",\n" + ",\n".join(lines))
                    truth.gpu_stage_us[(rank, stage)] = truth.gpu_stage_us.get((rank, stage), 0.0) + span
                    truth.kernel_stage_us[(rank, stage)] = truth.kernel_stage_us.get((rank, stage), 0.0) + kernel_sum
                    cpu = max(cpu, gpu_free) + 20.0
            out.write(f'\n  ],\n  "traceName": "{path.name}",\n  "displayTimeUnit": "ms",\n'
                      f'  "baseTimeNanoseconds": {BASE_NS}\n}}\n')
        union = 0.0
        reach = None
        for begin, end in intervals:
            if reach is None or begin > reach:
                union += end - begin
                reach = end
            elif end > reach:
                union += end - reach
                reach = end
        truth.gpu_idle_us[rank] = (intervals[-1][1] - intervals[0][0]) - union
        truth.bytes += path.stat().st_size
    return truth
