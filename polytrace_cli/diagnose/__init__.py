"""Diagnosis of a run's step times: per step, the excess over the model's expected step split into
causes; per run, findings ranked by seconds. Entry point: `explain_run(con, run, step, top)`."""

from polytrace_cli.diagnose.decompose import CAUSES
from polytrace_cli.diagnose.explain import Explanation, explain_run

__all__ = ["CAUSES", "Explanation", "explain_run"]
