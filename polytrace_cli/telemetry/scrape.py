"""Recording inference engines' `/metrics` pages beside a run, into one file `prometheus-scrape` reads.

Each round fetches every address once (with a timeout) and appends, per address, a marker line
`# polytrace-scrape url=<address> ts_ms=<fetch time>` and the page's lines, each sample stamped with the
fetch time unless it carries a timestamp of its own. A failed fetch appends a comment
`# polytrace-scrape-failed url=<address> ts_ms=<time> reason=<one line>` and the recording goes on.
Recording is bounded: it stops after `duration` seconds or `rounds` rounds, whichever comes first.
"""

from __future__ import annotations

import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

SAMPLE_WITHOUT_TIME = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*(?:\{[^}]*\})?\s+\S+)\s*$")
# A page larger than this is cut: an engine's /metrics is a few hundred KB at most.
MAX_PAGE_BYTES = 16 << 20


@dataclass
class ScrapeResult:
    rounds: int = 0
    pages: int = 0
    failures: int = 0
    samples: int = 0


def stamped(page: str, url: str, ts_ms: int) -> tuple[str, int]:
    """The page as the recorder appends it: a marker line, then its lines with `ts_ms` added to every
    sample that has no timestamp; and the number of samples."""
    out = [f"# polytrace-scrape url={url} ts_ms={ts_ms}"]
    samples = 0
    for line in page.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            out.append(line)
            continue
        samples += 1
        match = SAMPLE_WITHOUT_TIME.match(line)
        out.append(f"{match.group(1)} {ts_ms}" if match else line)
    return "\n".join(out) + "\n", samples


def fetch(url: str, timeout: float) -> str:
    """The text of one `/metrics` page."""
    with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 (the user's own addresses)
        return response.read(MAX_PAGE_BYTES).decode("utf-8", "replace")


def record(urls: list[str], output: Path, *, every: float, duration: float | None, rounds: int | None,
           timeout: float = 5.0, clock: Callable[[], float] = time.time,
           sleep: Callable[[float], None] = time.sleep) -> ScrapeResult:
    """Scrape every address in `urls` each `every` seconds into `output` (appended), until `duration`
    seconds have passed or `rounds` rounds were made. At least one bound must be given."""
    if duration is None and rounds is None:
        raise ValueError("a recording needs a bound: a duration or a number of rounds")
    result = ScrapeResult()
    started = clock()
    output.parent.mkdir(parents=True, exist_ok=True)
    with open(output, "a", encoding="utf-8") as handle:
        while True:
            round_started = clock()
            for url in urls:
                ts_ms = int(clock() * 1000)
                try:
                    page = fetch(url, timeout)
                except (OSError, urllib.error.URLError, ValueError) as error:
                    reason = " ".join(str(error).split())[:200]
                    handle.write(f"# polytrace-scrape-failed url={url} ts_ms={ts_ms} reason={reason}\n")
                    result.failures += 1
                    continue
                text, samples = stamped(page, url, ts_ms)
                handle.write(text)
                result.pages += 1
                result.samples += samples
            handle.flush()
            result.rounds += 1
            if rounds is not None and result.rounds >= rounds:
                return result
            next_round = round_started + every
            if duration is not None and next_round - started >= duration:
                return result
            sleep(max(0.0, next_round - clock()))
