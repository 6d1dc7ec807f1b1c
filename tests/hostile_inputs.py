"""Damaged and unusual input files with known truth: how many of their lines hold a good record.

Each case writes its files into a folder and says what a correct ingest does with them: how
many lines are stored (the good ones, which no bad line or bad file may cost) and which files
must be stored rather than skipped. `crash_harness` in benchmarks/ runs many seeded variants; the
bounded test runs one of each.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Case:
    name: str
    paths: list[Path]          # what `polytrace ingest` is given
    stored: int                # lines that must be stored, over every file
    must_read: list[Path]      # files that must not be skipped


def _verl_jsonl_line(step: int, rng: random.Random) -> str:
    return json.dumps({"step": step, "data": {"timing_s/step": round(rng.uniform(5, 60), 3),
                                              "timing_s/gen": round(rng.uniform(1, 30), 3)}})


def _verl_console_line(step: int, rng: random.Random) -> str:
    return (f"step:{step} - timing_s/gen:{rng.uniform(1, 30):.3f} - timing_s/step:{rng.uniform(30, 60):.3f}"
            f" - response_length/mean:{rng.uniform(100, 900):.1f}")


def _write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def verl_jsonl_with_bad_first_line(folder: Path, rng: random.Random, steps: int = 12) -> Case:
    """A verl JSONL walked in a folder whose first line is not a record (a warning, a traceback, NUL
    bytes, a step of 1e400, a line nested too deep)."""
    first = rng.choice([
        b"WARNING: something about CUDA\n",
        b"Traceback (most recent call last):\n  File \"x.py\", line 1\nValueError: no\n",
        b"\x00" * rng.randint(1, 4000) + b"\n",
        b'{"step": 1e400, "data": {"timing_s/step": 1.0}}\n',
        b'{"step": 0, "data": ' + b"[" * 200_000 + b"]" * 200_000 + b"}\n",
    ])
    good = "".join(_verl_jsonl_line(step, rng) + "\n" for step in range(1, steps + 1)).encode()
    path = _write(folder / "run" / "metrics.jsonl", first + good)
    return Case("verl-jsonl bad first line", [folder / "run"], steps, [path])


def verl_jsonl_bad_middle(folder: Path, rng: random.Random, steps: int = 12) -> Case:
    """A verl JSONL named on the command line with one bad line among good ones: a line nested too
    deep for a recursive parser, 400-digit numbers, 1e400, a line cut short."""
    bad = rng.choice([
        b'{"step": 99, "data": {"x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}}",
        b'{"step": 99, "data": {"x": 1' + b"0" * 400 + b"}}",
        b'{"step": 99, "data": {"x": -1e400}}',
        b'{"step": 99, "data": {"x": 1',
    ])
    lines = [_verl_jsonl_line(step, rng).encode() for step in range(1, steps + 1)]
    lines.insert(rng.randint(1, len(lines)), bad)
    path = _write(folder / "named" / "metrics.jsonl", b"\n".join(lines) + b"\n")
    return Case("verl-jsonl bad middle line", [path], steps, [path])


def jsonl_cr_only(folder: Path, rng: random.Random, steps: int = 10) -> Case:
    """A verl JSONL whose lines end in CR alone (old Mac line ends)."""
    text = "\r".join(_verl_jsonl_line(step, rng) for step in range(1, steps + 1)) + "\r"
    path = _write(folder / "cr" / "metrics.jsonl", text.encode())
    return Case("verl-jsonl CR-only line ends", [path], steps, [path])


def console_after_long_startup(folder: Path, rng: random.Random, steps: int = 15) -> Case:
    """A wandb run's output.log whose first metric line comes after more than 64 KB of start-up output."""
    noise_lines = rng.randint(1200, 3000)
    noise = "".join(f"(WorkerDict pid={rng.randint(1000, 9999)}) loading shard {i} of the model weights ...\n"
                    for i in range(noise_lines))
    metrics = "".join(_verl_console_line(step, rng) + "\n" for step in range(1, steps + 1))
    path = _write(folder / "wandb" / "run-20250101_000000-abc" / "files" / "output.log", (noise + metrics).encode())
    return Case("console after long start-up", [folder / "wandb"], steps, [path])


def wandb_csv_damaged(folder: Path, rng: random.Random, rows: int = 16) -> Case:
    """A wandb CSV export with one damaged row (NUL, bad UTF-8, a stray quote, a cut last line) or
    CR-only line ends; every good row must be stored."""
    lines = ['"Step","run - timing_s/step","run - timing_s/gen"']
    lines += [f'"{step}","{rng.uniform(30, 60):.3f}","{rng.uniform(1, 30):.3f}"' for step in range(1, rows + 1)]
    encoded = [line.encode() for line in lines]
    damage = rng.choice(["nul", "utf8", "quote", "cut", "cr"])
    good = rows
    ending = b"\n"
    if damage == "nul":
        encoded.insert(rng.randint(1, len(encoded)), b'"99","4\x002","1"')
    elif damage == "utf8":
        encoded.insert(rng.randint(1, len(encoded)), b'"99","4\xff2","1"')
    elif damage == "quote":
        encoded.insert(rng.randint(1, len(encoded)), b'"99","4"2","1"')
    elif damage == "cut":
        encoded.append(b'"99","4')
        ending = b""
    else:
        ending = b"\r"
    data = (b"\r" if damage == "cr" else b"\n").join(encoded) + ending
    path = _write(folder / "export" / f"wandb_{damage}.csv", data)
    return Case(f"wandb csv {damage}", [path], good, [path])


def wandb_table_bad_byte(folder: Path, rng: random.Random, rows: int = 6) -> Case:
    """A wandb table with one byte that is not UTF-8 in a generation, or a UTF-8 byte order mark."""
    data = [[step, f"prompt {step}", f"answer {step}", 1.0] for step in range(1, rows + 1)]
    text = json.dumps({"columns": ["step", "input", "output", "score"], "data": data}).encode()
    bad_byte = rng.random() < 0.5
    if bad_byte:  # one row holds the byte: that row alone is rejected
        text = text.replace(b"answer 3", b"answer \xff3")
    else:
        text = b"\xef\xbb\xbf" + text
    path = _write(folder / "files" / "media" / "table" / "val" / "generations_6_0a1b.table.json", text)
    return Case("wandb table bad byte" if bad_byte else "wandb table BOM", [path], rows - bad_byte, [path])


def wandb_summary_bom(folder: Path, rng: random.Random) -> Case:
    """wandb-summary.json written with a UTF-8 byte order mark."""
    document = {"_step": 10, "_runtime": 123.5, "timing_s/step": 41.0}
    path = _write(folder / "files" / "wandb-summary.json", b"\xef\xbb\xbf" + json.dumps(document).encode())
    return Case("wandb-summary BOM", [path], len(document), [path])


CASES: list[Callable[[Path, random.Random], Case]] = [
    verl_jsonl_with_bad_first_line, verl_jsonl_bad_middle, jsonl_cr_only, console_after_long_startup,
    wandb_csv_damaged, wandb_table_bad_byte, wandb_summary_bom,
]
