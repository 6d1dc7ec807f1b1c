"""Step files' strict decoding done ahead in a forked child gives the counts the decoder gives here,
never a count for a file that changed since, and the command line's ingest stores what a file-by-file
ingest stores."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from test_ingest_batch import packed_line, store_contents

from polytrace_cli.ingest.jsonl import strict_file_records
from polytrace_cli.ingest.registry import get_ingester
from polytrace_cli.ingest.runner import BATCH_JSON_MIN_MEAN_BYTES, BATCH_OVERLAP_MIN_BYTES, ingest_paths
from polytrace_cli.store import open_store

PACKED = get_ingester("polytrace-packed")
# Lines of a step file large enough to be decoded ahead (a line is under 150 bytes).
LINES = BATCH_JSON_MIN_MEAN_BYTES // 100


def write_step_files(folder: Path, steps: int, lines_per_step: int) -> list[Path]:
    """Packed step files of `lines_per_step` lines each."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for step in range(steps):
        path = folder / f"packed_lengths_step_{step}.jsonl"
        path.write_text("".join(packed_line(step, i, dp_rank=i % 2, outputs=(100 + i, 7, 9000)) + "\n"
                                for i in range(lines_per_step)))
        paths.append(path)
    return paths


def spoil(path: Path, line: int, old: str, new: str) -> None:
    """Replace `old` by `new` in line `line` of the file."""
    lines = path.read_text().splitlines(keepends=True)
    assert old in lines[line]
    lines[line] = lines[line].replace(old, new, 1)
    path.write_text("".join(lines))


# Run as a fresh process, as the command line is: start the child, then ask for counts as a batch would.
SCRIPT = textwrap.dedent("""
    import json, os, signal, sys, time
    from pathlib import Path
    from polytrace_cli import side_process
    from polytrace_cli.ingest.registry import get_ingester
    from polytrace_cli.ingest.strict_ahead import StrictAhead

    side_process.mark_fresh()
    action, paths = sys.argv[1], [Path(p) for p in sys.argv[2:]]
    ingester = get_ingester("polytrace-packed")
    out = {}
    with StrictAhead.start(paths) as ahead:
        out["forked"] = ahead.pid is not None
        if action == "kill":
            os.kill(ahead.pid, signal.SIGKILL)
        out["first"] = ahead.counts([p.resolve() for p in paths], ingester)
        if action == "change":
            first = paths[0]
            text = first.read_text().replace('"input": 10', '"input": "10"', 1)
            first.write_text(text)
            out["again"] = ahead.counts([p.resolve() for p in paths], ingester)
        out["served"] = ahead.served
    print(json.dumps(out))
""")


def run_script(action: str, paths: list[Path]) -> dict:
    done = subprocess.run([sys.executable, "-c", SCRIPT, action, *map(str, paths)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def decoded_here(paths: list[Path]) -> dict[str, int | None]:
    return {str(p.resolve()): strict_file_records(p, PACKED.spec) for p in paths}


def test_the_childs_counts_are_the_decoders_here_lax_and_broken_files_included(tmp_path):
    lines = LINES
    paths = write_step_files(tmp_path / "run", steps=5, lines_per_step=lines)
    spoil(paths[1], 3, '"input": 13', '"input": "13"')  # a string for an integer: DuckDB would read 13
    spoil(paths[2], 5, "[105, 7, 9000]", "[105, 7.5, 9000]")  # a fraction in the list of integers
    spoil(paths[3], 2, '"validate": false}', '"validate": false')  # not JSON
    small = tmp_path / "run" / "packed_lengths_step_9.jsonl"
    small.write_text(packed_line(9, 0) + "\n")  # too small to be decoded ahead: decoded here when asked
    expected = decoded_here([*paths, small])
    assert expected[str(paths[0].resolve())] == lines
    assert expected[str(paths[1].resolve())] is None and expected[str(paths[3].resolve())] == -1

    result = run_script("count", [*paths, small])
    assert result["forked"]
    assert result["first"] == expected
    assert result["served"] == len(paths)


def test_a_file_changed_after_the_child_decoded_it_is_decoded_again(tmp_path):
    paths = write_step_files(tmp_path / "run", steps=3, lines_per_step=LINES)
    result = run_script("change", paths)
    assert result["forked"] and result["first"] == decoded_here([p for p in paths if p != paths[0]]) | {
        str(paths[0].resolve()): LINES}
    again = result["again"]
    assert again[str(paths[0].resolve())] is None  # the string now in it is refused, not the old count kept
    assert again == decoded_here(paths)
    assert result["served"] == 3 + 2  # the changed file was not served from the child the second time


def test_a_child_that_dies_leaves_every_count_to_this_process(tmp_path):
    paths = write_step_files(tmp_path / "run", steps=4, lines_per_step=LINES)
    spoil(paths[2], 1, '"input": 11', '"input": 11.0')
    result = run_script("kill", paths)
    assert result["forked"]
    assert result["first"] == decoded_here(paths)


def test_the_command_lines_ingest_decoded_ahead_stores_what_file_by_file_ingest_stores(tmp_path):
    # More than BATCH_OVERLAP_MIN_BYTES in all: the counts are asked for once DuckDB has read the files.
    steps = 12
    lines = BATCH_OVERLAP_MIN_BYTES // steps // 150 + 200
    paths = write_step_files(tmp_path / "run", steps=steps, lines_per_step=lines)
    assert sum(p.stat().st_size for p in paths) > BATCH_OVERLAP_MIN_BYTES
    spoil(paths[4], 7, '"input": 17', '"input": "17"')
    spoil(paths[8], 9, "[109, 7, 9000]", "[109, true, 9000]")
    batched = tmp_path / "cli.duckdb"
    done = subprocess.run([sys.executable, "-m", "polytrace_cli.cli", "ingest", str(tmp_path / "run"), "--db",
                           str(batched), "--json"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    reports = {Path(r["path"]).name: r for r in json.loads(done.stdout)}
    assert reports[paths[4].name]["rejected"] == 1 and reports[paths[8].name]["rejected"] == 1
    assert sum(r["rows"] for r in reports.values()) == (steps * lines - 2) * 3

    alone = open_store(tmp_path / "alone.duckdb")
    cli = open_store(batched)
    try:
        ingest_paths(alone, [tmp_path / "run"], batch=False)
        assert store_contents(cli) == store_contents(alone)
    finally:
        alone.close()
        cli.close()
