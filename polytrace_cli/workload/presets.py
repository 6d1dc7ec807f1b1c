"""Built-in workload presets for the demo and for `polytrace synth --task` without a parameters file.

math: the published PolyTrace math fit (lognormal marginals and the 4-component joint Gaussian
  mixture in `enhanced_task_distribution_parameters.json`, Intern-S1 workloads, 385,024 samples),
  transcribed below, DAPO filtering on, 2 DP ranks and 8 responses per prompt like the verl DAPO trace.
code: shaped after the DeepCoder trace in PolyTrace (rllm): a 16,000-token response cap that many
  responses reach, reward timings from sandboxed tests. The lognormal parameters are illustrative.
search: shaped after the Search-R1 trace: multi-turn with a search tool, 3,000-token response cap,
  mostly 1–3 turns. Turn counts, token and latency parameters are illustrative.

math-verl (`verl_demo`): a verl console log of 300 GRPO steps on the math model, 4 DP ranks, a
32,768-token cap, validation every 50 steps and checkpoints every 100, with one of each workload
cause injected so that the step-time figures have something to show.
"""

from __future__ import annotations

import numpy as np

from polytrace_cli.workload.distributions import GaussianMixture2D, LengthModel, Marginal
from polytrace_cli.workload.steplog import Injection, StepTimeModel
from polytrace_cli.workload.synth import WorkloadSpec
from polytrace_cli.errors import PolytraceError

# Published math fit (enhanced_task_distribution_parameters.json, math_task.gmm_parameters), rounded.
_MATH_JOINT = GaussianMixture2D(
    weights=np.array([0.358504752818907, 0.07434340269703671, 0.3728319533326389, 0.19431989115141732]),
    means=np.array([[112.88734597117671, 4959.099111112346], [266.35306111535584, 12719.633617453097],
                    [145.42284338344732, 9174.831640824232], [138.15927257466163, 17654.857156495706]]),
    covariances=np.array([
        [[558.2999, -782.5312], [-782.5312, 4804084.9079]],
        [[16547.5809, -156139.9611], [-156139.9611, 36813304.2075]],
        [[1624.4403, -54104.3364], [-54104.3364, 11669296.4986]],
        [[1164.0897, 14184.8368], [14184.8368, 27740124.6705]],
    ]),
)


def _math_model() -> LengthModel:
    return LengthModel(
        prompt=Marginal("lognorm", {"s": 0.21286157406385864, "loc": -1908.36690259044, "scale": 3488.4470703882016}),
        response=Marginal("lognorm", {"s": 0.8221578425518301, "loc": 4.861523115832697, "scale": 767.2288034083723}),
        joint=_MATH_JOINT, task="math",
    )


def _code_model() -> LengthModel:
    return LengthModel(prompt=Marginal("lognorm", {"s": 0.5, "loc": 0.0, "scale": 450.0}),
                       response=Marginal("lognorm", {"s": 0.55, "loc": 0.0, "scale": 9000.0}), task="code")


def _search_model() -> LengthModel:
    return LengthModel(
        prompt=Marginal("lognorm", {"s": 0.08, "loc": 0.0, "scale": 320.0}),
        response=Marginal("lognorm", {"s": 0.6, "loc": 0.0, "scale": 120.0}),
        multiturn={"turns_pmf": {"1": 0.35, "2": 0.35, "3": 0.2, "4": 0.1},
                   "completion_tokens": {"family": "lognorm", "params": {"s": 0.6, "loc": 0.0, "scale": 90.0}},
                   "tool_latency_s": {"family": "lognorm", "params": {"s": 1.0, "loc": 0.0, "scale": 0.08}}},
        task="search",
    )


PRESETS = {
    "math": (_math_model, WorkloadSpec(task="math", steps=6, batch=48, n=8, dp_ranks=2, max_response_len=20480,
                                       dapo=True, reward_timings=False, drift=0.01)),
    "code": (_code_model, WorkloadSpec(task="code", steps=5, batch=16, n=8, dp_ranks=2, tp_size=4,
                                       max_response_len=16000)),
    "search": (_search_model, WorkloadSpec(task="search", steps=3, batch=16, n=4, dp_ranks=1,
                                           max_response_len=3000, multiturn=True, reward_timings=False)),
}


def preset(task: str) -> tuple[LengthModel, WorkloadSpec]:
    """The built-in model and workload shape for a task name."""
    if task not in PRESETS:
        raise PolytraceError(f"no built-in preset for task {task!r} (known: {', '.join(PRESETS)}); pass --params")
    make_model, spec = PRESETS[task]
    return make_model(), spec


VERL_DEMO_RUN = "math-verl"


def verl_demo() -> tuple[LengthModel, WorkloadSpec, StepTimeModel]:
    """The demo's verl run: the math model's lengths, its shape and its true step-time model."""
    spec = WorkloadSpec(task="math", steps=300, batch=32, n=8, dp_ranks=4, max_response_len=32768, drift=0.001)
    model = StepTimeModel(validate_every=50, checkpoint_every=100, injections=(
        Injection(60, "token_volume", 1.6), Injection(120, "long_tail"), Injection(140, "unexplained", 2.0),
        Injection(181, "warmup", 1.8), Injection(210, "dp_imbalance", 1.8), Injection(240, "weight_sync", 25.0)))
    return _math_model(), spec, model
