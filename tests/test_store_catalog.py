"""The store's `metric_aliases` rows and `steps` view come from the formats' declarations in Python: no
framework metric name sits in a SQL migration, and editing an alias reaches every store the next time it
is opened, read-only too."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from polytrace_cli.errors import PolytraceError
from polytrace_cli.ingest.formats.openrlhf import names as openrlhf_names
from polytrace_cli.ingest.formats.verl import names as verl_names
from polytrace_cli.ingest.registry import declared_metric_names
from polytrace_cli.ingest.sniffing import registered_metric_names
from polytrace_cli.ingest.driver import ingest_paths
from polytrace_cli.store import open_store
from polytrace_cli.store.catalog import STEP_COLUMNS, catalog_is_current

SCHEMAS = Path(__file__).resolve().parents[1] / "schemas"
# A verl console log of two steps; `timing_s/acme_rollout` is a key no format declares.
LOG = (
    "step:1 - timing_s/acme_rollout:12.5 - timing_s/reward:2.0 - timing_s/step:20.0 - val-core/acc:0.5\n"
    "step:2 - timing_s/acme_rollout:14.0 - timing_s/reward:3.0 - timing_s/step:22.0\n"
    "step:3 - val-core/acc:0.6\n"
)


@pytest.fixture
def verl_store(tmp_path) -> Path:
    log = tmp_path / "train.log"
    log.write_text(LOG)
    db = tmp_path / "store.duckdb"
    con = open_store(db)
    try:
        [report] = ingest_paths(con, [log], run_name="r")
        assert report.status == "ingested", report.message
    finally:
        con.close()
    return db


def _steps(db: Path) -> list[tuple]:
    con = open_store(db, read_only=True)
    try:
        return con.execute("SELECT step, gen_s, reward_s, step_s, is_validation_only FROM steps ORDER BY step").fetchall()
    finally:
        con.close()


def _declared_keys() -> set[str]:
    return {key for names in declared_metric_names()[0].values() for key in names}


def test_no_migration_names_a_framework_metric():
    keys = _declared_keys()
    assert "timing_s/gen" in keys and "timing/generation" in keys
    for path in sorted(SCHEMAS.glob("*.sql")):
        text = path.read_text()
        code = re.sub(r"--[^\n]*", "", text)
        assert "metric_aliases VALUES" not in code, path.name
        assert "VIEW steps" not in code, path.name
        named = [key for key in keys if f"'{key}'" in code]
        assert named == [], f"{path.name} names {named}"


def test_the_view_reads_the_declared_aliases(verl_store):
    # Validation-only step 3 holds only a `val-` key (a declared verl validation prefix).
    assert _steps(verl_store) == [(1, None, 2.0, 20.0, False), (2, None, 3.0, 22.0, False), (3, None, None, None, True)]


def test_an_edited_alias_reaches_a_store_opened_read_only(verl_store, monkeypatch):
    edited = {**verl_names.METRIC_ALIASES, "timing_s/acme_rollout": "gen_s"}
    monkeypatch.setattr(verl_names, "METRIC_ALIASES", edited)
    assert [row[:2] for row in _steps(verl_store)] == [(1, 12.5), (2, 14.0), (3, None)]
    con = open_store(verl_store, read_only=True)
    try:
        assert catalog_is_current(con)
        assert con.execute("SELECT format, canonical FROM metric_aliases WHERE key = 'timing_s/acme_rollout'"
                           " ORDER BY format").fetchall() == [("*", "gen_s"), ("verl-console", "gen_s"),
                                                              ("verl-jsonl", "gen_s")]
    finally:
        con.close()
    # And back: removing the alias again leaves no trace of it.
    monkeypatch.undo()
    assert [row[:2] for row in _steps(verl_store)] == [(1, None), (2, None), (3, None)]


def test_a_view_replaced_behind_the_code_is_written_again(verl_store):
    con = open_store(verl_store)
    con.execute("CREATE OR REPLACE VIEW steps AS SELECT 1 AS step")
    con.close()
    con = open_store(verl_store, read_only=True)
    try:
        columns = [row[0] for row in con.execute("DESCRIBE steps").fetchall()]
    finally:
        con.close()
    assert columns[:3] == ["run_id", "segment", "step"]
    assert columns[3:3 + len(STEP_COLUMNS)] == list(STEP_COLUMNS)


def test_two_frameworks_that_disagree_on_a_key_each_keep_their_meaning(verl_store, monkeypatch):
    # OpenRLHF's names say `timing_s/reward` is its make-experience time: verl's files keep verl's meaning,
    # and the key has no shared meaning (a tracker's file of an unknown trainer could be either).
    monkeypatch.setattr(openrlhf_names, "METRIC_ALIASES", {**openrlhf_names.METRIC_ALIASES,
                                                           "timing_s/reward": "make_experience_s"})
    by_format, _ = declared_metric_names()
    assert by_format["verl-console"]["timing_s/reward"] == "reward_s"
    assert by_format["openrlhf-console"]["timing_s/reward"] == "make_experience_s"
    assert [row[:3] for row in _steps(verl_store)] == [(1, None, 2.0), (2, None, 3.0), (3, None, None)]
    con = open_store(verl_store, read_only=True)
    try:
        assert con.execute("SELECT format, canonical FROM metric_aliases WHERE key = 'timing_s/reward'"
                           " ORDER BY format").fetchall() == [("openrlhf-console", "make_experience_s"),
                                                              ("verl-console", "reward_s"), ("verl-jsonl", "reward_s")]
    finally:
        con.close()


def test_a_names_module_with_a_name_that_is_not_canonical_is_a_one_line_error(verl_store, monkeypatch):
    monkeypatch.setattr(openrlhf_names, "METRIC_ALIASES", {**openrlhf_names.METRIC_ALIASES, "timing/gen": "Gen s"})
    with pytest.raises(PolytraceError, match="timing/gen"):
        declared_metric_names()
    # Every command then says so in one line, not a traceback.
    from typer.testing import CliRunner

    from polytrace_cli.cli import app

    result = CliRunner().invoke(app, ["runs", "--db", str(verl_store)])
    assert result.exit_code == 2 and result.output.strip().splitlines() == [
        "error: polytrace_cli.ingest.formats.openrlhf.names maps 'timing/gen' to 'Gen s', which is not a canonical"
        " name (lowercase letters, digits and underscores, from a letter)"]


def test_a_format_that_maps_a_key_its_framework_does_not_declare_is_refused_at_registration():
    from polytrace_cli.ingest.base import Ingester
    from polytrace_cli.ingest.registry import register

    class Mapped(Ingester):
        name = "verl-made-up"
        metric_aliases = {"timing_s/made_up": "gen_s"}

    Mapped.__module__ = "polytrace_cli.ingest.formats.verl.made_up"
    with pytest.raises(PolytraceError, match="format verl-made-up maps 'timing_s/made_up' to 'gen_s'"):
        register(Mapped)


def test_the_cheap_declarations_are_those_of_the_registered_formats():
    # Opening a store reads the names modules only; every registered format must declare through them.
    assert declared_metric_names() == registered_metric_names()


def test_only_the_formats_name_framework_metrics():
    # Analyses, the model and the report read canonical names (through metric_aliases or the steps view).
    # The synthetic log writers (workload/) write logs in the frameworks' own names, as the formats read
    # them. Keys that are plain words (OpenRLHF's `reward`) are also stage names, so only keys with a
    # `/` are looked for.
    keys = sorted(key for key in _declared_keys() if "/" in key)
    package = SCHEMAS.parent / "polytrace_cli"
    named = {}
    for path in sorted(package.rglob("*.py")):
        if path.relative_to(package).parts[0] in ("ingest", "workload"):
            continue
        text = path.read_text()
        found = [key for key in keys if f"'{key}'" in text or f'"{key}"' in text]
        if found:
            named[str(path.relative_to(package))] = found
    assert named == {}


def test_a_lake_reads_with_the_codes_aliases_not_those_it_was_written_with(verl_store, tmp_path, monkeypatch):
    from polytrace_cli.store.lake import open_lake, write_lake

    con = open_store(verl_store, read_only=True)
    try:
        write_lake(con, tmp_path / "lake")
    finally:
        con.close()
    monkeypatch.setattr(verl_names, "METRIC_ALIASES", {**verl_names.METRIC_ALIASES,
                                                       "timing_s/acme_rollout": "gen_s"})
    lake = open_lake(tmp_path / "lake")
    try:
        assert lake.execute("SELECT step, gen_s FROM steps ORDER BY step").fetchall() == [(1, 12.5), (2, 14.0), (3, None)]
    finally:
        lake.close()


def test_the_store_asks_for_the_names_handed_down_and_says_so_when_none_were(tmp_path):
    # In a fresh process that has loaded no format: `open_store` alone has no names to build the steps view
    # from (a one-line error), and `Store.open` hands the ingest registry's down.
    import subprocess
    import sys

    script = (
        "import sys\n"
        "from polytrace_cli.errors import StoreError\n"
        "from polytrace_cli.store import open_store\n"
        "try:\n"
        "    open_store(sys.argv[1])\n"
        "except StoreError as error:\n"
        "    print('refused:', error)\n"
        "from polytrace_cli import Store\n"
        "with Store.open(sys.argv[1]) as store:\n"
        "    print('columns:', len(store.connection.execute('DESCRIBE steps').fetchall()))\n"
    )
    out = subprocess.run([sys.executable, "-c", script, str(tmp_path / "s.duckdb")], capture_output=True,
                         text=True, check=True).stdout.splitlines()
    assert out[0] == "refused: the store was given no metric names: open it with polytrace_cli.Store.open"
    assert out[1] == f"columns: {3 + len(STEP_COLUMNS) + 5}"


# Two verl runs: `restarted` validates beside its training pairs at step 1, logs testing and checkpoint timers
# at step 2, a validation-only step 3 and a rank-token key the `steps` view has no column for, then begins again
# at step 2 (a second segment, flagged `restart`); `other` is a plain run whose pairs the view pivots beside them.
RESTARTED = (
    "step:1 - timing_s/gen:5.0 - timing_s/step:9.0 - global_seqlen/max:900 - response_length/mean:300 - val-core/acc:0.4\n"
    "step:2 - timing_s/gen:6.0 - timing_s/testing:2.0 - timing_s/save_checkpoint:1.0 - timing_s/step:12.0\n"
    "step:3 - val-core/acc:0.5\n"
    "step:2 - timing_s/gen:7.0 - timing_s/step:10.0 - global_seqlen/max:950\n"
    "step:3 - timing_s/gen:4.0 - timing_s/step:8.0 - response_length/mean:280\n"
)
OTHER = "step:1 - timing_s/gen:50.0 - timing_s/step:90.0\nstep:2 - timing_s/gen:60.0 - timing_s/step:99.0\n"


def test_the_steps_of_some_runs_are_the_steps_views_rows_of_them(tmp_path, store):
    from polytrace_cli.store.catalog import steps_of_runs_sql

    for name, text in (("restarted", RESTARTED), ("other", OTHER)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "train.log").write_text(text)
        ingest_paths(store, [tmp_path / name], run_name=name)
    ids = dict(store.execute("SELECT name, run_id FROM runs").fetchall())
    assert store.execute("SELECT count(*) FROM step_flags WHERE flag = 'restart'").fetchall()[0][0] > 0
    columns = ["gen_s", "step_s", "testing_s", "save_checkpoint_s", "response_length_mean"]
    listed = ", ".join(["run_id", "segment", "step", *columns, "is_validation_only", "has_testing",
                        "has_checkpoint", "truncated_line", "flags"])
    for chosen, where in (([ids["restarted"]], "true"), ([ids["other"]], "true"),
                          (sorted(ids.values()), "true"), (sorted(ids.values()), "step >= 2")):
        in_list = "(" + ", ".join(map(str, chosen)) + ")"
        from_view = store.execute(f"SELECT {listed} FROM steps WHERE run_id IN {in_list} AND {where}"
                                  " ORDER BY ALL").fetchall()
        own = store.execute(f"SELECT {listed} FROM ({steps_of_runs_sql(in_list, columns, where)}) ORDER BY ALL"
                            ).fetchall()
        assert own == from_view and own
    # A canonical name the view has no column for is read too: the largest value of the step's pairs of it.
    restarted = steps_of_runs_sql(f"({ids['restarted']})", ["rank_tokens_max"])
    seqlen = store.execute(f"SELECT segment, step, rank_tokens_max FROM ({restarted}) ORDER BY segment, step").fetchall()
    assert seqlen == [(0, 1, 900.0), (0, 2, None), (0, 3, None), (1, 2, 950.0), (1, 3, None)]
