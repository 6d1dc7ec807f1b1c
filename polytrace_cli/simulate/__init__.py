"""Simulation on the fitted step-time model: an honest backtest on held-out steps, and what a run
would have cost under other policies.

    from polytrace_cli.simulate import backtest_run, whatif_run
    backtest_run(con, "my_run").to_dict()                          # accuracy per stage vs baselines
    whatif_run(con, "my_run", ["balance", "no-validation"]).to_dict()
"""

from polytrace_cli.simulate.backtest import BacktestResult, accuracy, backtest_frame, backtest_run
from polytrace_cli.simulate.policies import POLICY_HELP, Policy, Scenario, WhatIfResult, parse_policy, whatif_run

__all__ = ["POLICY_HELP", "BacktestResult", "Policy", "Scenario", "WhatIfResult", "accuracy", "backtest_frame",
           "backtest_run", "parse_policy", "whatif_run"]
