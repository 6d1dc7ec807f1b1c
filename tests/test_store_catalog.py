"""The store's `metric_aliases` rows and `steps` view come from the formats' declarations in Python: no
framework metric name sits in a SQL migration, and editing an alias reaches every store the next time it
is opened, read-only too."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from polytrace_cli.ingest.formats.openrlhf import names as openrlhf_names
from polytrace_cli.ingest.formats.verl import names as verl_names
from polytrace_cli.ingest.registry import declared_metric_names, registered_metric_names
from polytrace_cli.ingest.runner import ingest_paths
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


def test_no_migration_names_a_framework_metric():
    keys, _ = declared_metric_names()
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
        assert con.execute("SELECT canonical FROM metric_aliases WHERE key = 'timing_s/acme_rollout'"
                           ).fetchall() == [("gen_s",)]
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


def test_two_formats_that_disagree_on_a_key_are_an_error(monkeypatch):
    monkeypatch.setattr(openrlhf_names, "METRIC_ALIASES", {**openrlhf_names.METRIC_ALIASES, "timing_s/gen": "reward_s"})
    with pytest.raises(ValueError, match="timing_s/gen"):
        declared_metric_names()


def test_the_cheap_declarations_are_those_of_the_registered_formats():
    # Opening a store reads the names modules only; every registered format must declare through them.
    assert declared_metric_names() == registered_metric_names()


def test_only_the_formats_name_framework_metrics():
    # Analyses, the model and the report read canonical names (through metric_aliases or the steps view).
    # The synthetic log writers (workload/) write logs in the frameworks' own names, as the formats read
    # them. Keys that are plain words (OpenRLHF's `reward`) are also stage names, so only keys with a
    # `/` are looked for.
    keys = [key for key in declared_metric_names()[0] if "/" in key]
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
