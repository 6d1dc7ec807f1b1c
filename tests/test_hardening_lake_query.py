"""A lake's manifest is data and `query` only reads: forged manifests, EXPLAIN ANALYZE, files outside."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from test_lake import _invoke, _ok


def one_line_error(result, *words):
    """Assert a command failed with one line (no traceback) holding every word; return that line."""
    assert result.exit_code != 0, result.output
    assert "Traceback" not in result.output
    message = result.output.strip().splitlines()[-1]
    for word in words:
        assert word in message, message
    return message


def _one_line_error(result, *words):
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1, result.output
    return one_line_error(result, *words)


@pytest.fixture(scope="module")
def lake(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("lake")
    _ok("synth", "--task", "math", "--out", root / "logs" / "alpha", "--num-steps", 2, "--batch", 2, "--n", 2,
        "--dp-ranks", 2, "--seed", 3)
    _ok("ingest", root / "logs" / "alpha", "--db", root / "store.duckdb")
    _ok("lake", root / "lake", "--db", root / "store.duckdb")
    return root / "lake"


@pytest.fixture
def forged(lake, tmp_path) -> Path:
    """A copy of the lake whose manifest the test edits."""
    import shutil

    copy = tmp_path / "forged"
    shutil.copytree(lake, copy)
    return copy


def _edit_manifest(folder: Path, change) -> None:
    manifest = json.loads((folder / "manifest.json").read_text())
    change(manifest)
    (folder / "manifest.json").write_text(json.dumps(manifest))


def _digests(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in folder.rglob("*") if p.is_file()}


def test_view_sql_in_a_manifest_is_never_run(forged, tmp_path):
    planted = tmp_path / "planted.csv"
    _edit_manifest(forged, lambda m: m["views"].update(
        samples=f"CREATE VIEW samples AS SELECT 1; COPY (SELECT 42) TO '{planted}'",
        steps=f"CREATE VIEW steps AS SELECT * FROM read_csv('{forged / 'manifest.json'}')"))
    runs = json.loads(_ok("runs", "--json", "--db", forged).output)
    assert [r["run"] for r in runs] == ["alpha"]
    # The views are this polytrace's own: samples has its rows, steps its columns.
    samples = json.loads(_ok("query", "select count(*) as n from samples", "--json", "--db", forged).output)
    assert samples[0]["n"] == 2 * 2 * 2
    _ok("query", "select step, run_id from steps limit 1", "--db", forged)
    assert not planted.exists()


@pytest.mark.parametrize("change, words", [
    (lambda m: m["tables"]["runs"]["columns"][0].__setitem__(
        1, "VARCHAR) AS x FROM read_csv('/etc/hostname') --"), ("not a known column type",)),
    (lambda m: m["tables"].update({'x" AS (SELECT 1); --': m["tables"]["runs"]}), ("not a plain identifier",)),
    (lambda m: m["files"][0].__setitem__("path", "runs/../../../outside/data.parquet"), ("inside the lake",)),
    (lambda m: m["views"].update(secrets="CREATE VIEW secrets AS SELECT 1"), ("does not define", "secrets")),
    (lambda m: m.__setitem__("files", {"a": 1}), ("files is not a list",)),
    (lambda m: m.__setitem__("schema_version", "1; DROP"), ("schema_version",)),
])
def test_a_forged_manifest_is_a_one_line_error(forged, change, words):
    _edit_manifest(forged, change)
    _one_line_error(_invoke("runs", "--db", forged), "not a valid lake manifest" if "does not define" not in words
                    else "lists views", *words)


def test_queries_on_a_lake_read_no_file_outside_its_parquet(lake, tmp_path):
    secret = tmp_path / "secret.csv"
    secret.write_text("a\n1\n")
    result = _invoke("query", f"select * from read_csv('{secret}')", "--db", lake)
    assert result.exit_code == 2 and "Traceback" not in result.output
    result = _invoke("query", f"select * from read_text('{lake / 'manifest.json'}')", "--db", lake)
    assert result.exit_code == 2 and "Traceback" not in result.output


@pytest.mark.parametrize("statement", [
    "EXPLAIN ANALYZE COPY (SELECT * FROM runs) TO '{target}' (FORMAT parquet)",
    "explain analyse select * from runs",
    "EXPLAIN /* plan */ ANALYZE SELECT 1",
    "EXPLAIN (ANALYZE) SELECT 1",
    " -- note\nEXPLAIN ANALYZE SELECT 1",
    "EXPLAIN COPY (SELECT 1) TO '{target}'",
])
def test_explain_runs_nothing(lake, statement):
    target = next(lake.glob("runs/run=*/data.parquet"))
    before = _digests(lake)
    _one_line_error(_invoke("query", statement.format(target=target), "--db", lake), "EXPLAIN of a SELECT only")
    assert _digests(lake) == before


def test_plain_explain_of_a_select_still_shows_its_plan(lake):
    result = _ok("query", "/* why */ EXPLAIN SELECT count(*) FROM samples", "--db", lake)
    assert "READ_PARQUET" in result.output.upper() or "SCAN" in result.output.upper()


def test_explain_analyze_on_a_store_is_refused_too(lake):
    store = lake.parent / "store.duckdb"
    _one_line_error(_invoke("query", "EXPLAIN ANALYZE SELECT 1", "--db", store), "EXPLAIN of a SELECT only")


def test_a_lake_folder_that_cannot_be_created_is_a_one_line_error(lake, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    _one_line_error(_invoke("lake", blocker / "lake", "--db", lake.parent / "store.duckdb"),
                    "cannot create lake")


@pytest.mark.parametrize("write, words", [
    (lambda text: "[" * 100_000 + "]" * 100_000, ("nested too deep",)),
    (lambda text: text.replace('"schema_version": ', '"schema_version": 1' + "0" * 400 + ', "x": ', 1),
     ("schema_version is not a whole number",)),
], ids=["deep", "400-digit-version"])
def test_a_manifest_nested_too_deep_or_with_a_huge_version_is_one_short_line(forged, write, words):
    manifest = forged / "manifest.json"
    manifest.write_text(write(manifest.read_text()))
    message = _one_line_error(_invoke("runs", "--db", forged), *words)
    assert len(message) < 400


def test_a_file_listed_100000_times_is_refused_at_once(forged):
    _edit_manifest(forged, lambda m: m.__setitem__("files", m["files"] + [m["files"][0]] * 100_000))
    _one_line_error(_invoke("runs", "--db", forged), "listed more than once")
