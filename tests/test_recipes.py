"""The recipes of docs/architecture.md, followed: a format and an analysis written from the docs in a package
of their own, installed for the test as a distribution (a `.dist-info` with entry points) on the path, and
used through the command line. Nothing in polytrace is changed to add them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jsonschema
import pytest

import schema_check
from polytrace_cli.schemas import json_schema

FORMAT_MODULE = '''
"""acme trainer metrics: a CSV with an `iteration` column and one column per metric (acme_metrics.csv)."""

from pathlib import Path

import duckdb

from polytrace_cli.errors import IngestError
from polytrace_cli.ingest.base import FileContext, Ingester, step_problem_sql, step_sql


class AcmeTrainerIngester(Ingester):
    name = "acme-trainer"
    version = "1"
    framework = "acme"
    description = "acme trainer metrics CSV (iteration, one column per metric)"
    metric_aliases = {"acme/rollout_s": "gen_s", "acme/total_s": "step_s"}
    validation_prefixes = ("acme_eval/",)

    def sniff(self, path: Path, head: bytes) -> bool:
        return path.name == "acme_metrics.csv" and head.startswith(b"iteration,")

    def load(self, ctx: FileContext) -> None:
        con = ctx.con
        try:
            con.execute("CREATE OR REPLACE TEMP TABLE acme AS SELECT row_number() OVER () AS row_no, *"
                        " FROM read_csv(?, header = true, all_varchar = true)", [str(ctx.path)])
        except duckdb.Error as error:
            raise IngestError(f"not a readable CSV: {str(error).splitlines()[0]}", "corrupt-file") from None
        metrics = [row[0] for row in con.execute("DESCRIBE acme").fetchall()][2:]
        rows = con.execute("SELECT count(*) FROM acme").fetchall()[0][0]
        ctx.lines = rows + 1
        ctx.ignore("CSV header")
        for row_no, text, code in con.execute(
                f"SELECT row_no, iteration, {step_problem_sql('iteration')} FROM acme"
                f" WHERE {step_sql('iteration')} IS NULL").fetchall():
            ctx.reject(row_no + 1, f"iteration is not a step: {text!r}", text, code=code)
        ctx.stored = rows - ctx.rejected
        columns = ", ".join('"' + name + '"' for name in metrics)
        ctx.insert(
            f"""
            INSERT INTO step_metrics (run_id, segment, step, key, value, text_value, file_id, line_no)
            SELECT ?, 0, {step_sql('iteration')}, key, TRY_CAST(cell AS DOUBLE),
                   CASE WHEN TRY_CAST(cell AS DOUBLE) IS NULL THEN cell END, ?, row_no + 1
            FROM (UNPIVOT (SELECT row_no, iteration, {columns} FROM acme) ON {columns} INTO NAME key VALUE cell)
            WHERE {step_sql('iteration')} IS NOT NULL AND trim(cell) != ''
            """,
            [ctx.run_id, ctx.file_id])
'''

ANALYSIS_MODULE = '''
"""acme_gen_share: the share of step time spent generating, Σ gen_s / Σ step_s over the steps that log both."""

import polars as pl

from polytrace_cli.analyze.common import ids_sql, small_frame
from polytrace_cli.analyze.registry import register

SUMMARY_COLUMNS = {"run": pl.String, "basis": pl.String, "steps": pl.Int64, "gen_share": pl.Float64}


@register("acme_gen_share", "share of step time spent generating")
def summary(con, run_ids, steps) -> pl.DataFrame:
    return small_frame(con, f"""
        SELECT r.name AS run, 'step_aggregates' AS basis, count(*)::BIGINT AS steps,
               sum(s.gen_s) / sum(s.step_s) AS gen_share
        FROM steps s JOIN runs r USING (run_id)
        WHERE s.run_id IN {ids_sql(run_ids)} AND {steps.sql('s.step')}
          AND s.gen_s IS NOT NULL AND s.step_s IS NOT NULL
        GROUP BY r.name ORDER BY r.name""", SUMMARY_COLUMNS)
'''

# Two training steps, a validation-only step (its only metric has the declared validation prefix) and a
# line whose iteration is not a step.
LOG = ("iteration,acme/rollout_s,acme/total_s,acme_eval/acc\n"
       "1,12.0,20.0,\n"
       "2,18.0,30.0,\n"
       "3,,,0.75\n"
       "x,1.0,2.0,\n")


@pytest.fixture(scope="module")
def plugin_path(tmp_path_factory) -> Path:
    site = tmp_path_factory.mktemp("site")
    package = site / "acme_polytrace"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "trainer_log.py").write_text(textwrap.dedent(FORMAT_MODULE))
    (package / "gen_share.py").write_text(textwrap.dedent(ANALYSIS_MODULE))
    info = site / "acme_polytrace-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-polytrace\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[polytrace.formats]\nacme_trainer = acme_polytrace.trainer_log:AcmeTrainerIngester\n\n"
        "[polytrace.analyses]\nacme_gen_share = acme_polytrace.gen_share\n")
    return site


def _polytrace(plugin_path: Path, *args) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(plugin_path), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "polytrace_cli.cli", *map(str, args)], env=env,
                          capture_output=True, text=True, timeout=120)


def _json(plugin_path: Path, *args):
    done = _polytrace(plugin_path, *args)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_plugin_format_and_analysis_work_through_the_command_line(plugin_path, tmp_path):
    formats = _json(plugin_path, "formats", "--json")
    assert formats[0]["format"] == "acme-trainer"
    log = tmp_path / "logs" / "acme_metrics.csv"
    log.parent.mkdir()
    log.write_text(LOG)
    db = tmp_path / "store.duckdb"
    [report] = _json(plugin_path, "ingest", log, "--run", "acme", "--db", db, "--json")
    assert (report["format"], report["status"]) == ("acme-trainer", "ingested")
    assert (report["lines"], report["stored"], report["ignored"], report["rejected"]) == (5, 3, 1, 1)
    steps = _json(plugin_path, "query", "SELECT step, gen_s, step_s, is_validation_only FROM steps ORDER BY step",
                  "--db", db, "--json")
    assert steps == [{"step": 1, "gen_s": 12.0, "step_s": 20.0, "is_validation_only": False},
                     {"step": 2, "gen_s": 18.0, "step_s": 30.0, "is_validation_only": False},
                     {"step": 3, "gen_s": None, "step_s": None, "is_validation_only": True}]
    analyzed = _json(plugin_path, "analyze", "--only", "acme_gen_share", "--db", db, "--json")
    # (12 + 18) / (20 + 30) over the two steps that log both.
    assert analyzed == {"acme_gen_share": [{"run": "acme", "basis": "step_aggregates", "steps": 2, "gen_share": 0.6}]}
    schema_check.validate(analyzed, json_schema("analyze"), cls=jsonschema.Draft202012Validator)


def test_without_the_plugin_neither_exists(tmp_path):
    done = subprocess.run([sys.executable, "-m", "polytrace_cli.cli", "formats", "--json"], capture_output=True,
                          text=True, timeout=120)
    assert "acme-trainer" not in done.stdout


def test_a_broken_plugin_is_one_line(plugin_path, tmp_path):
    log = tmp_path / "acme_metrics.csv"
    log.write_text(LOG)
    module = plugin_path / "acme_polytrace" / "trainer_log.py"
    module.rename(module.with_name("moved.py"))
    try:
        done = _polytrace(plugin_path, "ingest", log, "--db", tmp_path / "s.duckdb")
    finally:
        module.with_name("moved.py").rename(module)
    assert done.returncode != 0
    assert "Traceback" not in done.stderr + done.stdout
    assert "format plugin acme_trainer" in done.stderr
