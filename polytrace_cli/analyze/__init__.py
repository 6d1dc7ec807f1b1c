"""Characterization analyses (METRICS.md), one module each; importing this registers them all."""
from polytrace_cli.analyze import lengths  # noqa: F401
from polytrace_cli.analyze import drift  # noqa: F401
from polytrace_cli.analyze import longtail  # noqa: F401
from polytrace_cli.analyze import fit  # noqa: F401
from polytrace_cli.analyze import imbalance  # noqa: F401
from polytrace_cli.analyze import steps  # noqa: F401
from polytrace_cli.analyze import tools  # noqa: F401
from polytrace_cli.analyze import filtering  # noqa: F401
