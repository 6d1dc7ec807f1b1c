"""TensorBoard event files, written at test time: both scalar encodings, tag mapping, damage."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from typer.testing import CliRunner

from polytrace_cli.cli import app
from polytrace_cli.ingest.driver import ingest_paths

pytest.importorskip("tensorboard")

from tensorboard.compat.proto import event_pb2, summary_pb2  # noqa: E402
from tensorboard.summary.writer.event_file_writer import EventFileWriter  # noqa: E402
from tensorboard.util import tensor_util  # noqa: E402

PROJECT_ROOT = Path(__file__).resolve().parents[1]


def _simple(tag: str, value: float) -> summary_pb2.Summary.Value:
    return summary_pb2.Summary.Value(tag=tag, simple_value=value)


def _tensor(tag: str, value: float) -> summary_pb2.Summary.Value:
    metadata = summary_pb2.SummaryMetadata(plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars"))
    return summary_pb2.Summary.Value(tag=tag, tensor=tensor_util.make_tensor_proto(np.float32(value)),
                                     metadata=metadata)


def _histogram(tag: str) -> summary_pb2.Summary.Value:
    return summary_pb2.Summary.Value(tag=tag, histo=summary_pb2.HistogramProto(min=0, max=1, num=2))


def write_events(folder: Path, events: list[tuple[int, list]]) -> Path:
    """An event file under `folder` holding the header event and one event per (step, values)."""
    folder.mkdir(parents=True, exist_ok=True)
    writer = EventFileWriter(str(folder))
    for step, values in events:
        writer.add_event(event_pb2.Event(step=step, wall_time=1.0e9 + step, summary=summary_pb2.Summary(value=values)))
    writer.close()
    [path] = folder.glob("events.out.tfevents.*")
    return path


def _metrics(con) -> list[tuple]:
    return con.execute("SELECT segment, step, key, value, line_no FROM step_metrics ORDER BY line_no, key").fetchall()


def test_verl_simple_value_scalars_and_ignored_summaries(store, tmp_path):
    write_events(tmp_path / "verl_run" / "tensorboard_log", [
        (1, [_simple("timing_s/gen", 10.5), _simple("timing_s/step", 20.0)]),
        (1, [_histogram("actor/entropy_hist")]),
        (2, [_simple("timing_s/gen", 11.0), _simple("timing_s/step", 22.5), _histogram("actor/h")]),
    ])
    [report] = ingest_paths(store, [tmp_path / "verl_run"])
    assert report.format == "tensorboard-events" and report.run == "verl_run"
    assert (report.lines, report.stored, report.ignored, report.rejected, report.rows) == (4, 2, 2, 0, 4)
    assert _metrics(store) == [
        (0, 1, "timing_s/gen", 10.5, 2), (0, 1, "timing_s/step", 20.0, 2),
        (0, 2, "timing_s/gen", 11.0, 4), (0, 2, "timing_s/step", 22.5, 4),
    ]
    assert dict(store.execute("SELECT rule, lines FROM ignored_lines").fetchall()) == {
        "file header": 1, "non-scalar summary": 1}
    assert store.execute("SELECT step, gen_s, step_s FROM steps ORDER BY step").fetchall() == [
        (1, 10.5, 20.0), (2, 11.0, 22.5)]
    assert store.execute("SELECT framework FROM runs").fetchall() == [("verl",)]


def test_openrlhf_tensor_scalars_train_prefix_dropped_eval_kept(store, tmp_path):
    path = write_events(tmp_path / "orl", [
        (5, [_tensor("train/policy_loss", 0.25), _tensor("train/timing/step_total", 60.0)]),
        (5, [_tensor("eval/pass1", 0.5)]),
        (3, [_tensor("train/policy_loss", 0.75)]),
    ])
    [report] = ingest_paths(store, [path])
    assert (report.lines, report.stored, report.rejected) == (4, 3, 0)
    assert _metrics(store) == [
        (0, 5, "policy_loss", 0.25, 2), (0, 5, "timing/step_total", 60.0, 2),
        (0, 5, "eval/pass1", 0.5, 3), (1, 3, "policy_loss", 0.75, 4),
    ]
    assert store.execute("SELECT framework FROM runs").fetchall() == [("openrlhf",)]


@pytest.mark.parametrize("damage", ["truncate", "corrupt"])
def test_damaged_file_keeps_records_before_the_damage(store, tmp_path, damage):
    path = write_events(tmp_path / "broken", [(s, [_simple("timing_s/step", float(s))]) for s in range(1, 6)])
    data = bytearray(path.read_bytes())
    if damage == "truncate":
        data = data[:-7]  # cuts into the last record (step 5)
    else:
        # Flip a byte inside the data of the fourth event record (step 3): its CRC no longer matches.
        offset = 0
        for _ in range(3):
            length = int.from_bytes(data[offset:offset + 8], "little")
            offset += length + 16
        data[offset + 12 + 2] ^= 0xFF
    path.write_bytes(bytes(data))
    [report] = ingest_paths(store, [path])
    # A cut tail loses step 5; a corrupt record loses step 3 alone: reading resyncs at the next record.
    kept, lost = ([1, 2, 3, 4], 5) if damage == "truncate" else ([1, 2, 4, 5], 3)
    assert [row[1] for row in _metrics(store)] == kept
    assert (report.lines, report.stored, report.ignored, report.rejected) == (6, 4, 1, 1)
    [(line_no, reason)] = store.execute("SELECT line_no, reason FROM ingest_errors").fetchall()
    assert line_no == lost + 1 and reason.startswith(f"event file damaged after {lost} readable records")


def test_without_tensorboard_the_file_is_rejected_naming_the_extra(tmp_path):
    path = write_events(tmp_path / "run", [(1, [_simple("timing_s/step", 1.0)])])
    script = ("import sys; sys.modules['tensorboard'] = None; from polytrace_cli.cli import app; "
              "sys.argv = ['polytrace'] + sys.argv[1:]; app()")
    result = subprocess.run(
        [sys.executable, "-c", script, "ingest", str(path), "--db", str(tmp_path / "s.duckdb"), "--json"],
        capture_output=True, text=True, cwd=PROJECT_ROOT, timeout=120,
    )
    assert result.returncode != 0 and "Traceback" not in result.stderr
    [report] = json.loads(result.stdout)
    assert report["status"] == "rejected"
    assert report["message"] == ("reading TensorBoard event files needs the tensorboard package:"
                                 " pip install 'polytrace[tensorboard]'")


def test_mixed_folder_one_run_per_source_through_the_cli(tmp_path):
    """Every format side by side: each file sniffed right, one run per source, exact steps and flags."""
    fixtures = Path(__file__).parent / "fixtures"
    mixed = tmp_path / "mixed"
    shutil.copytree(fixtures / "wandb" / "wandb", mixed / "wandb")
    (mixed / "csv_run").mkdir(parents=True)
    shutil.copy(fixtures / "wandb" / "wandb_export.csv", mixed / "csv_run" / "export.csv")
    (mixed / "orl_run").mkdir()
    shutil.copy(fixtures / "openrlhf" / "train_global_step.log", mixed / "orl_run" / "train.log")
    (mixed / "verl_console").mkdir()
    shutil.copy(fixtures / "verl" / "console_v05" / "train.log", mixed / "verl_console" / "train.log")
    (mixed / "verl_jsonl").mkdir()
    shutil.copy(fixtures / "verl" / "file_logger" / "metrics.jsonl", mixed / "verl_jsonl" / "metrics.jsonl")
    (mixed / "verl_rollout" / "rollout_data").mkdir(parents=True)
    shutil.copy(fixtures / "verl" / "rollout" / "rollout_data" / "7.jsonl", mixed / "verl_rollout" / "rollout_data")
    write_events(mixed / "tb_run", [(1, [_simple("timing_s/gen", 3.0), _simple("timing_s/step", 5.0)]),
                                    (2, [_simple("timing_s/gen", 4.0), _simple("timing_s/step", 6.5)])])
    db = str(tmp_path / "s.duckdb")
    runner = CliRunner()
    result = runner.invoke(app, ["ingest", str(mixed), "--db", db, "--json"])
    assert result.exit_code == 0, result.output
    reports = json.loads(result.stdout)
    found = {Path(r["path"]).relative_to(mixed.resolve()).as_posix(): (r["format"], r["run"]) for r in reports}
    wandb_run = "run-20250518_123456-abc123xy"
    files = f"wandb/{wandb_run}/files"
    tb_file = next(name for name in found if name.startswith("tb_run/"))
    assert found == {
        "csv_run/export.csv": ("wandb-csv", "csv_run"),
        "orl_run/train.log": ("openrlhf-console", "orl_run"),
        "verl_console/train.log": ("verl-console", "verl_console"),
        "verl_jsonl/metrics.jsonl": ("verl-jsonl", "verl_jsonl"),
        "verl_rollout/rollout_data/7.jsonl": ("verl-rollout", "verl_rollout"),
        tb_file: ("tensorboard-events", "tb_run"),
        f"{files}/output.log": ("verl-console", wandb_run),
        f"{files}/config.yaml": ("wandb-config", wandb_run),
        f"{files}/wandb-summary.json": ("wandb-summary", wandb_run),
        f"{files}/media/table/val/generations_1_1a2b3c4d.table.json": ("wandb-table", wandb_run),
        f"{files}/media/table/val/generations_3_9f8e7d6c.table.json": ("wandb-table", wandb_run),
    }
    assert all(r["status"] == "ingested" for r in reports)

    result = runner.invoke(app, ["runs", "--db", db, "--json"])
    assert result.exit_code == 0, result.output
    runs = {r["run"]: (r["first_step"], r["last_step"], r["segments"], r["samples"]) for r in json.loads(result.stdout)}
    assert runs == {
        "csv_run": (1, 2, 2, 0),
        "orl_run": (1, 2, 2, 0),
        "verl_console": (101, 102, 2, 0),
        "verl_jsonl": (1, 4, 2, 0),
        "verl_rollout": (7, 7, None, 3),  # the dump's file name, 7.jsonl
        "tb_run": (1, 2, 1, 0),
        wandb_run: (1, 3, 1, 3),  # metrics at steps 1-2, a generations table at step 3
    }

    result = runner.invoke(app, ["query", "--db", db, "--json",
                                 "SELECT r.name, s.segment, s.step, s.gen_s, s.step_s, s.has_testing, s.has_checkpoint,"
                                 " s.flags FROM steps s JOIN runs r USING (run_id) ORDER BY r.name, segment, step"])
    assert result.exit_code == 0, result.output
    steps = [tuple(row.values()) for row in json.loads(result.stdout)]
    assert steps == [
        ("csv_run", 0, 1, 30.0, 60.5, False, False, []),
        ("csv_run", 0, 2, 31.25, None, False, False, []),
        ("csv_run", 1, 2, None, 70.0, False, False, []),
        ("orl_run", 0, 1, 30.0, 63.0, False, False, []),
        ("orl_run", 0, 2, 31.5, 65.25, False, False, []),
        ("orl_run", 1, 1, None, 70.0, False, False, ["restart"]),
        (wandb_run, 0, 1, 30.0, 60.0, False, False, []),
        (wandb_run, 0, 2, 31.0, 62.0, False, False, []),
        ("tb_run", 0, 1, 3.0, 5.0, False, False, []),
        ("tb_run", 0, 2, 4.0, 6.5, False, False, []),
        ("verl_console", 0, 101, 6.5, 10.0, False, False, ["resumed"]),
        ("verl_console", 0, 102, 7.0, 11.0, False, False, []),
        ("verl_console", 1, 101, 5.0, 10.0, False, False, ["restart"]),
        ("verl_jsonl", 0, 3, 30.5, 60.25, False, False, ["resumed"]),
        ("verl_jsonl", 0, 4, 31.0, 62.0, False, True, []),
        ("verl_jsonl", 1, 1, 29.75, 59.0, True, False, ["restart"]),
    ]


def test_a_step_outside_the_step_range_rejects_its_record(store, tmp_path):
    write_events(tmp_path / "verl_run" / "tensorboard_log", [
        (1, [_simple("timing_s/step", 20.0)]),
        (2**40, [_simple("timing_s/step", 21.0)]),
        (2, [_simple("timing_s/step", 22.0)]),
    ])
    [report] = ingest_paths(store, [tmp_path / "verl_run"])
    assert (report.lines, report.stored, report.ignored, report.rejected) == (4, 2, 1, 1)
    assert store.execute("SELECT line_no, code, reason FROM ingest_errors").fetchall() == [
        (3, "out-of-range", f"step {2**40} is outside the step range")]
    assert store.execute("SELECT step FROM step_metrics ORDER BY step").fetchall() == [(1,), (2,)]


def test_a_record_length_of_2_62_with_a_valid_length_crc_costs_that_record_alone(store, tmp_path):
    """A length that runs far past the end of the file, its CRC right (so the framing trusts it):
    the reader resyncs at the next whole record instead of losing the file."""
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

    path = write_events(tmp_path / "run", [(s, [_simple("timing_s/step", float(s))]) for s in range(1, 9)])
    data = bytearray(path.read_bytes())
    offset = 0
    for _ in range(4):  # the header event and steps 1..3: the fifth record is step 4
        offset += int.from_bytes(data[offset:offset + 8], "little") + 16
    length = (2**62).to_bytes(8, "little")
    data[offset:offset + 12] = length + masked_crc32c(length).to_bytes(4, "little")
    path.write_bytes(bytes(data))
    [report] = ingest_paths(store, [path])
    assert [row[1] for row in _metrics(store)] == [1, 2, 3, 5, 6, 7, 8]
    assert store.execute("SELECT line_no, code FROM ingest_errors").fetchall() == [(5, "corrupt-file")]
    assert (report.lines, report.stored, report.ignored, report.rejected) == (9, 7, 1, 1)


def test_a_malformed_tensor_rejects_its_record_alone(store, tmp_path):
    bad = summary_pb2.Summary.Value(tag="timing_s/step", tensor=tensor_util.make_tensor_proto(np.float32(1.0)))
    bad.tensor.tensor_content = b"\x01\x02\x03"  # three bytes for one float32
    bad.tensor.ClearField("float_val")
    path = write_events(tmp_path / "run", [(1, [_simple("timing_s/step", 1.0)]), (2, [bad]),
                                           (3, [_tensor("timing_s/step", 3.0)])])
    [report] = ingest_paths(store, [path])
    assert [row[1] for row in _metrics(store)] == [1, 3]
    assert store.execute("SELECT line_no, code FROM ingest_errors").fetchall() == [(3, "unparsable-line")]
    assert (report.lines, report.stored, report.ignored, report.rejected) == (4, 2, 1, 1)
