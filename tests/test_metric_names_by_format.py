"""Metric names are keyed by (format, key): each pair of `step_metrics` takes the meaning its file's format
gives the key, else the one every format that names the key shares (`named_step_metrics`, and the `steps`
view over it). Two formats may give one key two meanings; one format may not, and a name that is not
canonical is refused when the format is registered. A store written before the names were keyed by format
opens and is upgraded."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from polytrace_cli.errors import PolytraceError
from polytrace_cli.ingest import registry
from polytrace_cli.ingest.base import Ingester
from polytrace_cli.ingest.driver import ingest_paths
from polytrace_cli.ingest.formats.verl.jsonl import VerlJsonlIngester
from polytrace_cli.ingest.registry import declared_metric_names, format_names, register
from polytrace_cli.store import open_store
from polytrace_cli.store.catalog import SHARED, alias_rows, shared_names
from polytrace_cli.store.migrations import SCHEMA_VERSION, schema_version


class AlphaJsonl(VerlJsonlIngester):
    """A trainer whose `completion_length` is the step's mean response length (TRL's meaning)."""

    name = "alpha-jsonl"
    metric_aliases = {"completion_length": "response_length_mean", "timing_s/step": "step_s"}

    def sniff(self, path: Path, head: bytes) -> bool:
        return path.name.startswith("alpha") and super().sniff(path, head)


class BetaJsonl(VerlJsonlIngester):
    """A trainer whose `completion_length` is the step's longest response."""

    name = "beta-jsonl"
    metric_aliases = {"completion_length": "response_length_max", "timing_s/step": "step_s"}

    def sniff(self, path: Path, head: bytes) -> bool:
        return path.name.startswith("beta") and super().sniff(path, head)


@pytest.fixture
def two_formats(monkeypatch):
    """AlphaJsonl and BetaJsonl registered as plugin formats are (`registry.plugin_ingesters`), for this test."""
    from polytrace_cli.ingest.sniffing import all_ingesters

    all_ingesters()  # every built-in format registered before the registry is copied, and restored after
    monkeypatch.setattr(registry, "_REGISTRY", list(registry._REGISTRY))
    monkeypatch.setattr(registry, "_PLUGINS", list(registry._PLUGINS))
    for ingester in (AlphaJsonl, BetaJsonl):
        register(ingester)
        registry._PLUGINS.append(registry._REGISTRY.pop())
    yield


def _jsonl(path: Path, rows: list[dict]) -> Path:
    import json

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _mlflow_metric(root: Path, key: str, lines: list[str]) -> Path:
    """An MLflow file-store run folder's metric file (`<run>/metrics/<key>`: timestamp value step lines)."""
    run = root / "mlruns" / "0" / "abc123"
    (run / "metrics").mkdir(parents=True, exist_ok=True)
    (run / "meta.yaml").write_text("run_id: abc123\n")
    path = run / "metrics" / key
    path.write_text("".join(line + "\n" for line in lines))
    return path


def test_the_shared_names_are_the_keys_every_format_names_alike():
    by_format = {"a": {"k": "x", "same": "s"}, "b": {"k": "y", "same": "s"}, "c": {"only_c": "z"}}
    assert shared_names(by_format) == {"only_c": "z", "same": "s"}
    assert alias_rows(by_format) == [("a", "k", "x"), ("a", "same", "s"), ("b", "k", "y"), ("b", "same", "s"),
                                     ("c", "only_c", "z"), (SHARED, "only_c", "z"), (SHARED, "same", "s")]


def test_two_formats_give_one_key_each_its_own_meaning(two_formats, tmp_path, db_path, fresh_store):
    by_format, _ = declared_metric_names()
    assert by_format["alpha-jsonl"]["completion_length"] == "response_length_mean"
    assert by_format["beta-jsonl"]["completion_length"] == "response_length_max"
    alpha = _jsonl(tmp_path / "a" / "alpha.jsonl", [{"step": 1, "data": {"completion_length": 120.0, "timing_s/step": 9.0}},
                                                    {"step": 2, "data": {"completion_length": 130.0, "timing_s/step": 8.0}}])
    beta = _jsonl(tmp_path / "b" / "beta.jsonl", [{"step": 1, "data": {"completion_length": 700.0, "timing_s/step": 5.0}}])
    # A tracker's file (MLflow names no key) of an unknown trainer: `completion_length` means nothing there
    # (the formats disagree), `timing_s/step` what every format naming it says.
    tracker = _mlflow_metric(tmp_path / "c", "completion_length", ["1700000000000 55.0 1"])
    _mlflow_metric(tmp_path / "c", "step_time", ["1700000000000 4.0 1"])
    con = open_store(fresh_store(db_path))
    try:
        for name, path in (("alpha", alpha), ("beta", beta), ("tracker", tracker.parent)):
            [*reports] = ingest_paths(con, [path], run_name=name)
            assert all(report.status == "ingested" for report in reports), [r.message for r in reports]
        steps = con.execute(
            "SELECT r.name, s.step, s.response_length_mean, s.response_length_max, s.step_s"
            " FROM steps s JOIN runs r USING (run_id) ORDER BY r.name, s.step").fetchall()
        named = con.execute(
            "SELECT DISTINCT f.format, n.canonical FROM named_step_metrics n JOIN files f USING (file_id)"
            " WHERE n.key = 'completion_length' ORDER BY f.format").fetchall()
    finally:
        con.close()
    assert steps == [("alpha", 1, 120.0, None, 9.0), ("alpha", 2, 130.0, None, 8.0),
                     ("beta", 1, None, 700.0, 5.0),
                     ("tracker", 1, None, None, 4.0)]  # `step_time` is TRL's step time, no other format's
    assert named == [("alpha-jsonl", "response_length_mean"), ("beta-jsonl", "response_length_max"),
                     ("mlflow-metric", None)]


def test_without_the_second_meaning_a_tracker_reads_the_shared_one(tmp_path, db_path, fresh_store):
    # The built-in formats agree on `completion_length` (TRL's mean): an MLflow file of it has that meaning.
    tracker = _mlflow_metric(tmp_path, "completion_length", ["1700000000000 55.0 1"])
    con = open_store(fresh_store(db_path))
    try:
        ingest_paths(con, [tracker.parent], run_name="tracker")
        assert con.execute("SELECT step, response_length_mean FROM steps").fetchall() == [(1, 55.0)]
    finally:
        con.close()


class _Named(Ingester):
    name = "made-up-format"

    def sniff(self, path: Path, head: bytes) -> bool:
        return False


@pytest.mark.parametrize("aliases, message", [
    ([("completion_length", "response_length_mean"), ("completion_length", "response_length_max")],
     "format made-up-format maps 'completion_length' to both 'response_length_mean' and 'response_length_max':"
     " a format gives a key one meaning"),
    ({"timing/gen": "Gen-s"}, "format made-up-format maps 'timing/gen' to 'Gen-s', which is not a canonical name"
                              " (lowercase letters, digits and underscores, from a letter)"),
    ({"": "gen_s"}, "format made-up-format maps '', which is not a metric key (a non-empty string)"),
    ([("timing/gen",)], "format made-up-format: metric_aliases holds ('timing/gen',), not a (key, canonical name) pair"),
])
def test_a_format_whose_names_clash_or_are_not_canonical_is_refused_at_registration(aliases, message, monkeypatch):
    monkeypatch.setattr(registry, "_REGISTRY", list(registry._REGISTRY))
    format_class = type("Clashing", (_Named,), {"metric_aliases": aliases})
    with pytest.raises(PolytraceError) as raised:
        register(format_class)
    assert str(raised.value) == message and "\n" not in message
    assert not any(i.name == "made-up-format" for i in registry._REGISTRY)


def test_the_same_pair_twice_is_one_name():
    assert format_names("format f", [("k", "gen_s"), ("k", "gen_s")]) == {"k": "gen_s"}


def test_no_format_may_take_the_shared_names_format(monkeypatch):
    monkeypatch.setattr(registry, "_REGISTRY", list(registry._REGISTRY))
    with pytest.raises(PolytraceError, match="no format may be named '\\*'"):
        register(type("Star", (_Named,), {"name": SHARED}))


def test_a_names_module_that_gives_a_key_twice_is_refused(tmp_path):
    # Python keeps the last of a repeated dict key without a word: the literal is read for it.
    module = tmp_path / "names.py"
    module.write_text('METRIC_ALIASES = {\n    "timing/gen": "gen_s",\n    "timing/gen": "reward_s",\n}\n')
    with pytest.raises(PolytraceError, match="acme.names maps 'timing/gen' to both 'gen_s' and 'reward_s'"):
        registry.check_names_literal("acme.names", module)
    # Every built-in names module passes.
    for name in registry.metric_name_modules():
        registry.check_names_literal(name, Path(registry.names_module(name).__file__))


def test_a_built_in_format_not_listed_in_its_names_formats_is_refused(monkeypatch):
    from polytrace_cli.ingest.formats.verl import names as verl_names

    monkeypatch.setattr(registry, "_REGISTRY", list(registry._REGISTRY))
    unlisted = type("Unlisted", (_Named,), {"name": "verl-unlisted", "metric_aliases": verl_names.METRIC_ALIASES})
    unlisted.__module__ = "polytrace_cli.ingest.formats.verl.unlisted"
    with pytest.raises(PolytraceError, match="format verl-unlisted maps metric keys but"
                                             " polytrace_cli.ingest.formats.verl.names does not list it in FORMATS"):
        register(unlisted)


def test_a_store_written_before_names_were_keyed_by_format_opens_and_is_upgraded(tmp_path, fresh_store):
    """The previous layout: `metric_aliases (key PRIMARY KEY, canonical)` and a `steps` view joining it on the
    key alone, schema 022. Made from a current store by putting them back."""
    log = tmp_path / "run" / "train.log"
    log.parent.mkdir()
    log.write_text("step:1 - timing_s/gen:12.5 - timing_s/step:20.0\nstep:2 - timing_s/gen:14.0 - timing_s/step:22.0\n")
    db = tmp_path / "old.duckdb"
    con = open_store(fresh_store(db))
    ingest_paths(con, [log], run_name="r")
    before = con.execute("SELECT step, gen_s, step_s FROM steps ORDER BY step").fetchall()
    con.close()
    old = duckdb.connect(str(db))
    old.execute("DELETE FROM schema_migrations WHERE version >= 23")  # 023 and what came after
    old.execute("DROP VIEW steps")
    old.execute("DROP VIEW named_step_metrics")
    old.execute("DROP TABLE metric_aliases")
    old.execute("CREATE TABLE metric_aliases (key VARCHAR PRIMARY KEY, canonical VARCHAR NOT NULL)")
    old.execute("INSERT INTO metric_aliases VALUES ('timing_s/gen', 'gen_s'), ('timing_s/step', 'step_s')")
    old.execute("CREATE VIEW steps AS SELECT sm.run_id, sm.segment, sm.step, max(sm.value) FILTER"
                " (WHERE a.canonical = 'gen_s') AS gen_s FROM step_metrics sm LEFT JOIN metric_aliases a"
                " ON a.key = sm.key GROUP BY ALL")
    old.execute("COMMENT ON VIEW steps IS 'polytrace catalog 0123456789abcdef'")
    assert old.execute("SELECT max(version) FROM schema_migrations").fetchall() == [(22,)]
    old.close()
    # Opened for reading, it is upgraded (as every older store is) and reads as before.
    reader = open_store(db, read_only=True)
    try:
        assert schema_version(reader) == SCHEMA_VERSION
        assert reader.execute("SELECT step, gen_s, step_s FROM steps ORDER BY step").fetchall() == before
        assert reader.execute("SELECT format, canonical FROM metric_aliases WHERE key = 'timing_s/gen'"
                              " ORDER BY format").fetchall() == [("*", "gen_s"), ("verl-console", "gen_s"),
                                                                 ("verl-jsonl", "gen_s")]
    finally:
        reader.close()
    assert before == [(1, 12.5, 20.0), (2, 14.0, 22.0)]


def test_a_format_given_names_by_two_sources_is_refused():
    from polytrace_cli.ingest.registry import names_by_format

    with pytest.raises(PolytraceError, match="format f is given metric names by both one.names and format f"):
        names_by_format([("one.names", ["f"], {"k": "gen_s"}, ()), ("format f", ["f"], {"k": "gen_s"}, ())])


def test_the_short_view_when_every_format_agrees_reads_as_the_whole_rule(tmp_path, db_path, fresh_store):
    # With today's formats no key means two things, and `named_step_metrics` joins the shared rows alone;
    # the rule in full (the format's row, else the shared one) gives every pair the same name.
    from polytrace_cli.store.catalog import declared_names, named_step_metrics_sql

    by_format, _ = declared_names()
    assert "files f" not in named_step_metrics_sql(by_format)
    whole = named_step_metrics_sql({**by_format, "made-up-format": {"timing_s/gen": "reward_s"}})
    assert "files f" in whole
    log = tmp_path / "run" / "train.log"
    log.parent.mkdir()
    log.write_text("step:1 - timing_s/gen:12.5 - timing_s/step:20.0 - acme/made_up:1.0\n"
                   "step:2 - timing_s/gen:14.0 - timing_s/step:22.0\n")
    con = open_store(fresh_store(db_path))
    try:
        ingest_paths(con, [log], run_name="r")
        con.execute(whole.replace("VIEW named_step_metrics", "TEMP VIEW whole_rule"))
        short = con.execute("SELECT * FROM named_step_metrics ORDER BY line_no, key").fetchall()
        assert short == con.execute("SELECT * FROM whole_rule ORDER BY line_no, key").fetchall()
    finally:
        con.close()
    assert [row[3:5] + row[-1:] for row in short] == [
        ("acme/made_up", 1.0, None), ("timing_s/gen", 12.5, "gen_s"), ("timing_s/step", 20.0, "step_s"),
        ("timing_s/gen", 14.0, "gen_s"), ("timing_s/step", 22.0, "step_s")]
