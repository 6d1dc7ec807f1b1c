"""The analysis registry: a fixed, listed order whatever was imported first."""

from __future__ import annotations

import subprocess
import sys


def test_order_is_the_listed_order_whatever_was_imported_first():
    # A fresh interpreter, so no earlier test decides which analysis modules are already loaded.
    code = (
        "import polytrace_cli.analyze.filtering, polytrace_cli.analyze.imbalance, polytrace_cli.analyze.drift\n"
        "from polytrace_cli.analyze.registry import ANALYSES, all_analyses\n"
        "print(' '.join(all_analyses()))\n"
        "print(' '.join(ANALYSES))\n"
    )
    shown, listed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                   check=True).stdout.splitlines()
    # The modules imported first come later in ANALYSES: the listed order wins, not the import order.
    assert listed.split().index("filtering") > listed.split().index("drift")
    assert shown.split() == listed.split()


def test_every_analysis_has_a_summary_and_a_description():
    from polytrace_cli.analyze.registry import ANALYSES, all_analyses

    analyses = all_analyses()
    assert list(analyses) == list(ANALYSES)
    for name, analysis in analyses.items():
        assert analysis.name == name
        assert analysis.description
        assert callable(analysis.summary)
