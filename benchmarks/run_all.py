"""Run every benchmark script in this folder and print their figures (`make bench`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

if __name__ == "__main__":
    failures = 0
    for script in sorted(HERE.glob("*.py")):
        if script.name == "run_all.py" or script.name.startswith("_"):
            continue
        print(f"\n== {script.name}", flush=True)
        failures += subprocess.run([sys.executable, str(script)]).returncode != 0
    sys.exit(1 if failures else 0)
