"""`polytrace watch`: follow a log as a job writes it, ingest each step as it lands and judge it
against the run's step-time model fitted on the steps before it.

    from polytrace_cli.watch import watch_log
    watch_log(con, Path("logs/train.log"), on_event=print, settings=WatchSettings(idle_exit=60))
"""

from polytrace_cli.watch.follow import EXIT_CRASH, WatchResult, WatchSettings, watch_log
from polytrace_cli.watch.judge import MIN_TRAINING_STEPS, StepJudge

__all__ = ["EXIT_CRASH", "MIN_TRAINING_STEPS", "StepJudge", "WatchResult", "WatchSettings", "watch_log"]
