"""One pipeline for console logs (a training job's stdout captured to a file).

`reading` splits a file into numbered lines and repairs damaged text, `noise` names the rules that
non-metric lines are counted under, and `pipeline` runs the steps every console format shares:
read, clean (ANSI colours, Ray prefixes, `[repeated Nx across cluster]`, progress-bar redraws;
`console_lines`), classify, reject damaged text, parse metric lines with the format's grammar,
cut segments on restarts, store, and account `lines = stored + ignored + rejected`. A console
format (`formats/verl/console.py`, `formats/openrlhf/console.py`) is a `ConsoleGrammar`: how its
metric lines look and parse, and what it reads from the log besides. See docs/console.md.
"""

from polytrace_cli.ingest.console.noise import NoiseRules
from polytrace_cli.ingest.console.pipeline import (ConsoleGrammar, ParsedMetrics, flag_schema, load_console,
                                                   metric_schema, printed_step_schema)

__all__ = ["ConsoleGrammar", "NoiseRules", "ParsedMetrics", "flag_schema", "load_console", "metric_schema",
           "printed_step_schema"]
