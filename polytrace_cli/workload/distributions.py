"""Length models: the distributions a synthetic workload samples prompt and response lengths from.

Two parameter files are understood:
- the published PolyTrace file (`enhanced_task_distribution_parameters.json`, from the Intern-S1
  workloads): scipy lognorm `[s, loc, scale]` marginals and a 4-component 2-D Gaussian mixture over
  (prompt, response) for the math task;
- polytrace's own `polytrace-params/1` file, which names a scipy.stats family and its parameters
  for each marginal and may carry a joint Gaussian mixture and empirical quantiles.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
from scipy import stats

from polytrace_cli.errors import PolytraceError

OWN_FORMAT = "polytrace-params/1"
# Correlation (on the Gaussian copula scale) of the responses of one prompt when sampling from marginals.
WITHIN_PROMPT_RHO = 0.5


@dataclass(frozen=True)
class Marginal:
    """A scipy.stats family with its keyword parameters (e.g. lognorm s, loc, scale)."""

    family: str
    params: dict

    def sample(self, rng: np.random.Generator, size: int) -> np.ndarray:
        return self._frozen.rvs(size=size, random_state=rng)

    @cached_property
    def _frozen(self):
        # Freezing a scipy distribution builds its docstring (about 1 ms): a multi-turn workload samples
        # one marginal per turn of each trajectory, so it is frozen once per Marginal.
        distribution = getattr(stats, self.family, None)
        if distribution is None:
            raise PolytraceError(f"unknown distribution family {self.family!r}")
        return distribution(**self.params)

    def cdf(self, x: np.ndarray | float) -> np.ndarray:
        """F(x) of the family."""
        return self._frozen.cdf(x)

    def ppf(self, u: np.ndarray) -> np.ndarray:
        """The inverse CDF F⁻¹(u)."""
        return self._frozen.ppf(u)


@dataclass(frozen=True)
class GaussianMixture2D:
    """A mixture of 2-D Gaussians over (prompt length, response length), or over their logarithms
    (`space='log'`, lengths = exp of the draw)."""

    weights: np.ndarray
    means: np.ndarray
    covariances: np.ndarray
    space: str = "linear"

    def _to_space(self, lengths: float) -> float:
        return float(np.log(lengths)) if self.space == "log" else float(lengths)

    def _from_space(self, values: np.ndarray) -> np.ndarray:
        return np.exp(values) if self.space == "log" else values

    def sample(self, rng: np.random.Generator, size: int) -> tuple[np.ndarray, np.ndarray]:
        """`size` independent (prompt, response) pairs."""
        prompts, responses = self.sample_groups(rng, size, 1)
        return prompts, responses[:, 0]

    def sample_groups(self, rng: np.random.Generator, groups: int, n: int, cap: float | None = None,
                      clip_ratio: float | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Prompts (groups,) and responses (groups, n): each group draws a component k and a prompt
        x ~ N(μ_p, Σ_pp); its n responses are drawn from the conditional Gaussian of component k,

            y | x ~ N(μ_r + Σ_rp/Σ_pp · (x − μ_p),  Σ_rr − Σ_rp²/Σ_pp),

        so every (prompt, response) pair is a draw from the joint mixture and the responses of one
        prompt are correlated through the shared prompt and component. With `clip_ratio` (the share
        of responses the fitted run had at the cap; the mixture describes the uncensored rest), a
        response is the cap with probability clip_ratio, else a draw of the conditional truncated
        below the cap (inverse CDF: y = μ + σ·Φ⁻¹(v·Φ((t − μ)/σ)), v uniform, t the cap in the
        mixture's space). Without it, responses are returned unclipped. In linear space the
        conditional is also truncated below 1 token the same way, instead of clamping negative draws.
        """
        components = rng.choice(len(self.weights), size=groups, p=self.weights / self.weights.sum())
        mean, cov = self.means[components], self.covariances[components]
        prompts = mean[:, 0] + np.sqrt(np.maximum(cov[:, 0, 0], 0)) * rng.standard_normal(groups)
        slope = cov[:, 1, 0] / np.where(cov[:, 0, 0] > 0, cov[:, 0, 0], np.inf)
        centre = mean[:, 1] + slope * (prompts - mean[:, 0])
        sd = np.sqrt(np.maximum(cov[:, 1, 1] - slope * cov[:, 1, 0], 1e-12))
        uniform = rng.random((groups, n))
        # Linear space: truncated below 1 token (a length cannot be <= 0), by the same inverse CDF.
        low = stats.norm.cdf((1.0 - centre) / sd)[:, None] if self.space != "log" else 0.0
        censored = cap is not None and clip_ratio is not None
        high = stats.norm.cdf((self._to_space(cap) - centre) / sd)[:, None] if censored else 1.0
        z = stats.norm.ppf(np.clip(low + uniform * (high - low), 1e-12, 1 - 1e-12))
        responses = self._from_space(centre[:, None] + sd[:, None] * z)
        if censored:
            responses = np.where(rng.random((groups, n)) < clip_ratio, float(cap), np.minimum(responses, cap))
        return self._from_space(prompts), responses


@dataclass(frozen=True)
class Quantiles:
    """Inverse-CDF sampling by linear interpolation between evenly spaced quantiles."""

    values: np.ndarray

    def sample(self, rng: np.random.Generator, size: int) -> np.ndarray:
        return self.ppf(rng.random(size))

    def ppf(self, u: np.ndarray) -> np.ndarray:
        """Linear interpolation of the quantile grid at u."""
        return np.interp(u, np.linspace(0.0, 1.0, len(self.values)), self.values)

    def cdf(self, x: np.ndarray | float) -> np.ndarray:
        """The piecewise-linear CDF matching `ppf`."""
        return np.interp(x, self.values, np.linspace(0.0, 1.0, len(self.values)))


@dataclass
class LengthModel:
    """How to draw (prompt_len, response_len) pairs; joint mixture first, else the marginals."""

    prompt: Marginal | Quantiles | None = None
    response: Marginal | Quantiles | None = None
    joint: GaussianMixture2D | None = None
    max_response_len: int | None = None
    n_sampling: int | None = None
    dp_ranks: int | None = None
    multiturn: dict | None = None
    task: str | None = None
    clip_ratio: float | None = None

    def sample(self, rng: np.random.Generator, size: int, cap: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """`size` independent (prompt, response) pairs as positive integers (see `sample_groups`)."""
        prompts, responses = self.sample_groups(rng, size, 1, cap)
        return prompts, responses[:, 0]

    def sample_groups(self, rng: np.random.Generator, groups: int, n: int,
                      cap: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Prompt lengths (groups,) and the lengths of each prompt's n responses (groups, n), positive integers.

        Every response has the model's response marginal (the groups only correlate them):
        - joint mixture: `GaussianMixture2D.sample_groups`;
        - marginals: the prompt from its marginal; responses through a Gaussian copula with
          within-prompt correlation ρ = WITHIN_PROMPT_RHO: u = Φ(√ρ·z_group + √(1−ρ)·ε), z and ε
          standard normal, response = F⁻¹(u).
        With a cap: responses above it are clipped to it. When the cap is the one the model was
        fitted at and the model records its clip ratio c (the fit then describes the responses
        below the cap), the cap is drawn with probability c and otherwise F⁻¹ is taken on the part
        below the cap: response = F⁻¹(u/(1−c) · F(cap)) for u < 1 − c, else the cap.
        """
        censored = (cap is not None and self.clip_ratio is not None and self.max_response_len is not None
                    and int(cap) == int(self.max_response_len))
        if self.joint is not None:
            prompts, responses = self.joint.sample_groups(rng, groups, n, cap if censored else None,
                                                          self.clip_ratio if censored else None)
        else:
            if self.prompt is None or self.response is None:
                raise PolytraceError("the parameters file has neither a joint model nor both marginals")
            prompts = self.prompt.sample(rng, groups)
            shared = rng.standard_normal((groups, 1))
            own = rng.standard_normal((groups, n))
            u = stats.norm.cdf(np.sqrt(WITHIN_PROMPT_RHO) * shared + np.sqrt(1 - WITHIN_PROMPT_RHO) * own)
            u = np.clip(u, 1e-12, 1 - 1e-12)
            if censored:
                clip = float(self.clip_ratio)
                below = float(self.response.cdf(cap))
                responses = np.where(u >= 1 - clip, float(cap),
                                     self.response.ppf(np.clip(u / max(1 - clip, 1e-12) * below, 1e-12, 1 - 1e-12)))
            else:
                responses = self.response.ppf(u)
        responses = _positive_int(responses)
        if cap is not None:
            responses = np.minimum(responses, int(cap))
        return _positive_int(prompts), responses


def _positive_int(values: np.ndarray) -> np.ndarray:
    return np.maximum(np.rint(values), 1).astype(np.int64)


def _marginal(node: dict | None) -> Marginal | None:
    if not node or not node.get("family"):
        return None
    return Marginal(node["family"], dict(node.get("params") or {}))


def _lognorm_triplet(node: dict) -> Marginal:
    s, loc, scale = node["parameters"]
    return Marginal("lognorm", {"s": s, "loc": loc, "scale": scale})


# Tool latency is not in the published file: the illustrative search-tool latency of the presets.
PUBLISHED_TOOL_LATENCY = {"family": "lognorm", "params": {"s": 1.0, "loc": 0.0, "scale": 0.08}}
TOOL_TASKS = ("tool", "tool_calling")


def load_published_tool(document: dict) -> LengthModel:
    """A multi-turn model from the published `tool_calling_task`: the call-count distribution as
    `turns_pmf` and, per call count k, the Gaussian (mean_vector, covariance_matrix) over the
    features input_1..k, output_1..k, ... as a sequence model (see `synth.sequence_draw`)."""
    tool = document.get("tool_calling_task") or {}
    counts = {str(k): float(v) for k, v in (tool.get("call_count_distribution") or {}).items()}
    models = {str(k): {"names": m["feature_names"], "mean": m["mean_vector"], "covariance": m["covariance_matrix"]}
              for k, m in (tool.get("sequence_models") or {}).items() if m.get("mean_vector")}
    counts = {k: v for k, v in counts.items() if k in models}
    if not counts:
        raise PolytraceError("the published parameters file has no tool-calling sequence models")
    total = sum(counts.values())
    return LengthModel(multiturn={"turns_pmf": {k: v / total for k, v in counts.items()}, "sequence_models": models,
                                  "tool_latency_s": PUBLISHED_TOOL_LATENCY}, task="tool")


def load_published(document: dict, task: str = "math") -> LengthModel:
    """A length model from the published PolyTrace parameters document: the math task's length
    models, or (task tool / tool_calling) the tool-calling sequence models (`load_published_tool`)."""
    if task in TOOL_TASKS:
        return load_published_tool(document)
    if task != "math" or "math_task" not in document:
        raise PolytraceError("the published parameters file carries the math task and the tool-calling task "
                             f"(--task math, tool), not {task!r}")
    math = document["math_task"]
    gmm = math.get("gmm_parameters")
    joint = None
    if gmm:
        joint = GaussianMixture2D(np.asarray(gmm["weights"], float), np.asarray(gmm["means"], float),
                                  np.asarray(gmm["covariances"], float))
    return LengthModel(prompt=_lognorm_triplet(math["input_distribution"]),
                       response=_lognorm_triplet(math["output_distribution"]), joint=joint, task="math")


def load_own(document: dict, sampler: str = "parametric") -> LengthModel:
    """A length model from a `polytrace-params/1` document.

    sampler 'parametric' uses the joint mixture when present, else the fitted marginals;
    'empirical' samples the stored quantiles (inverse CDF).
    """
    joint_node = document.get("joint")
    joint = None
    if sampler == "parametric" and joint_node and joint_node.get("weights"):
        joint = GaussianMixture2D(np.asarray(joint_node["weights"], float), np.asarray(joint_node["means"], float),
                                  np.asarray(joint_node["covariances"], float), joint_node.get("space") or "linear")
    if sampler == "empirical":
        empirical = document.get("empirical") or {}
        if not empirical.get("prompt_quantiles") or not empirical.get("response_quantiles"):
            raise PolytraceError("--sampler empirical needs empirical quantiles in the parameters file")
        prompt = Quantiles(np.asarray(empirical["prompt_quantiles"], float))
        response = Quantiles(np.asarray(empirical["response_quantiles"], float))
    else:
        prompt, response = _marginal(document.get("prompt")), _marginal(document.get("response"))
    return LengthModel(prompt=prompt, response=response, joint=joint,
                       max_response_len=document.get("max_response_len"), n_sampling=document.get("n_sampling"),
                       dp_ranks=document.get("dp_ranks"), multiturn=document.get("multiturn"),
                       task=document.get("task"),
                       clip_ratio=document.get("clip_ratio") if sampler == "parametric" else None)


def read_params_json(path: str | Path) -> dict | list:
    """The JSON document of a parameters file; a missing or non-JSON file is a user error."""
    try:
        return json.loads(Path(path).read_text("utf-8"))
    except FileNotFoundError:
        raise PolytraceError(f"no parameters file at {path}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise PolytraceError(f"{path} is not a JSON parameters file: {error}") from None


def load_params(path: str | Path, task: str = "math", sampler: str = "parametric") -> LengthModel:
    """Read either parameters format, recognised by its content."""
    document = read_params_json(path)
    if not isinstance(document, dict):
        raise PolytraceError(f"{path} is not a parameters file: its JSON is not an object")
    if document.get("format") == OWN_FORMAT:
        return load_own(document, sampler)
    if "math_task" in document:
        return load_published(document, task)
    raise PolytraceError(f"{path} is neither a polytrace-params/1 file nor the published PolyTrace parameters")
