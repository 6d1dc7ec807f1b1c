"""Screenshots of a report page taken by headless Chromium, at the widths people read it at.

    python tests/screenshots.py reports/demo/index.html reports/screenshots

writes `<out>/<report>-<width>.png` for each of WIDTHS, each the whole page at that width (its height read
from the page itself: `data-page-height`, set by the page's own script once it has loaded). `make
screenshots` takes them of the demo report; CI keeps `reports/screenshots/` as an artifact. The browser
tests share the way Chromium is started.
"""

from __future__ import annotations

import html
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]
WIDTHS = (1400, 800)
# The first screen's height: a screenshot of only the top of the page is this tall.
SCREEN_HEIGHT = 1000


def chromium_executable() -> str | None:
    """The chromium executable on the PATH, or None."""
    return shutil.which("chromium") or shutil.which("chromium-browser")


def run_chromium(executable: str, profile: Path, *args: str) -> subprocess.CompletedProcess:
    """Run headless Chromium once with its own profile folder."""
    return subprocess.run([executable, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args],
                          capture_output=True, text=True, timeout=180, check=False)


def page_facts(executable: str, profile: Path, url: str, width: int) -> dict[str, str]:
    """The `data-*` attributes the page's script sets on <body> once loaded, at a window `width` px wide:
    page-height, page-width (the widest the content reaches), images, broken-images, figure-boxes,
    top-height (where the top section, findings and what would help, ends)."""
    dom = run_chromium(executable, profile, f"--window-size={width},{SCREEN_HEIGHT}", "--virtual-time-budget=10000",
                       "--dump-dom", url)
    body = re.search(r"<body([^>]*)>", dom.stdout)
    if not body:
        raise RuntimeError(f"chromium did not render {url}: {dom.stderr[-500:]}")
    return {name: html.unescape(value) for name, value in re.findall(r'data-([a-z-]+)="([^"]*)"', body.group(1))}


def screenshot(executable: str, profile: Path, url: str, path: Path, width: int, height: int) -> Path:
    """A screenshot of the page `width` × `height` px, from its top."""
    run_chromium(executable, profile, f"--screenshot={path}", f"--window-size={width},{height}", "--hide-scrollbars",
                 url)
    if not path.exists():
        raise RuntimeError(f"chromium wrote no screenshot of {url}")
    return path


def take_screenshots(index: Path, out: Path, widths: tuple[int, ...] = WIDTHS) -> list[Path]:
    """The whole page of the report at each width, as `<out>/<report folder>-<width>.png`."""
    executable = chromium_executable()
    if executable is None:
        raise RuntimeError("chromium is not installed (apt-get install chromium)")
    out.mkdir(parents=True, exist_ok=True)
    url = Path(index).resolve().as_uri()
    shots = []
    with tempfile.TemporaryDirectory() as profiles:
        for width in widths:
            facts = page_facts(executable, Path(profiles) / f"dom-{width}", url, width)
            height = int(facts.get("page-height", SCREEN_HEIGHT))
            path = out / f"{Path(index).parent.name}-{width}.png"
            shots.append(screenshot(executable, Path(profiles) / f"shot-{width}", url, path, width, height))
    return shots


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python tests/screenshots.py REPORT/index.html OUT_FOLDER")
    try:
        shots = take_screenshots(Path(sys.argv[1]), Path(sys.argv[2]))
    except RuntimeError as error:
        sys.exit(f"error: {error}")
    for shot in shots:
        print(shot)
