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
from pathlib import Path

import numpy as np
from scipy import stats

from polytrace_cli.errors import PolytraceError

OWN_FORMAT = "polytrace-params/1"


@dataclass(frozen=True)
class Marginal:
    """A scipy.stats family with its keyword parameters (e.g. lognorm s, loc, scale)."""

    family: str
    params: dict

    def sample(self, rng: np.random.Generator, size: int) -> np.ndarray:
        distribution = getattr(stats, self.family, None)
        if distribution is None:
            raise PolytraceError(f"unknown distribution family {self.family!r}")
        return distribution(**self.params).rvs(size=size, random_state=rng)


@dataclass(frozen=True)
class GaussianMixture2D:
    """A mixture of 2-D Gaussians over (prompt length, response length)."""

    weights: np.ndarray
    means: np.ndarray
    covariances: np.ndarray

    def sample(self, rng: np.random.Generator, size: int) -> tuple[np.ndarray, np.ndarray]:
        components = rng.choice(len(self.weights), size=size, p=self.weights / self.weights.sum())
        out = np.empty((size, 2))
        for k in range(len(self.weights)):
            chosen = components == k
            if chosen.any():
                out[chosen] = rng.multivariate_normal(self.means[k], self.covariances[k], size=int(chosen.sum()))
        return out[:, 0], out[:, 1]


@dataclass(frozen=True)
class Quantiles:
    """Inverse-CDF sampling by linear interpolation between evenly spaced quantiles."""

    values: np.ndarray

    def sample(self, rng: np.random.Generator, size: int) -> np.ndarray:
        grid = np.linspace(0.0, 1.0, len(self.values))
        return np.interp(rng.random(size), grid, self.values)


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

    def sample(self, rng: np.random.Generator, size: int) -> tuple[np.ndarray, np.ndarray]:
        """`size` (prompt, response) pairs as positive integers (response not yet capped)."""
        if self.joint is not None:
            prompt, response = self.joint.sample(rng, size)
        else:
            if self.prompt is None or self.response is None:
                raise PolytraceError("the parameters file has neither a joint model nor both marginals")
            prompt, response = self.prompt.sample(rng, size), self.response.sample(rng, size)
        return _positive_int(prompt), _positive_int(response)


def _positive_int(values: np.ndarray) -> np.ndarray:
    return np.maximum(np.rint(values), 1).astype(np.int64)


def _marginal(node: dict | None) -> Marginal | None:
    if not node or not node.get("family"):
        return None
    return Marginal(node["family"], dict(node.get("params") or {}))


def _lognorm_triplet(node: dict) -> Marginal:
    s, loc, scale = node["parameters"]
    return Marginal("lognorm", {"s": s, "loc": loc, "scale": scale})


def load_published(document: dict, task: str = "math") -> LengthModel:
    """A length model from the published PolyTrace parameters document (math task)."""
    if task != "math" or "math_task" not in document:
        raise PolytraceError("the published parameters file carries length models for the math task only")
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
                                  np.asarray(joint_node["covariances"], float))
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
                       task=document.get("task"))


def load_params(path: str | Path, task: str = "math", sampler: str = "parametric") -> LengthModel:
    """Read either parameters format, recognised by its content."""
    try:
        document = json.loads(Path(path).read_text("utf-8"))
    except FileNotFoundError:
        raise PolytraceError(f"no parameters file at {path}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise PolytraceError(f"{path} is not a JSON parameters file: {error}") from None
    if document.get("format") == OWN_FORMAT:
        return load_own(document, sampler)
    if "math_task" in document:
        return load_published(document, task)
    raise PolytraceError(f"{path} is neither a polytrace-params/1 file nor the published PolyTrace parameters")
