"""The console pipeline with a grammar of its own: what a new console format gets for free."""

from __future__ import annotations

import pytest
from polars.testing import assert_frame_equal

from polytrace_cli.lazy import polars as pl

from polytrace_cli.ingest.base import FileContext
from polytrace_cli.ingest.console import ConsoleGrammar, NoiseRules, ParsedMetrics, load_console
from polytrace_cli.ingest.console.pipeline import metric_schema
from polytrace_cli.ingest.segments import line_segments, lone_line_segment


class IterGrammar(ConsoleGrammar):
    """Metric lines `iter N | key=value key=value`, read in Python."""

    anchor = "iter"
    noise = NoiseRules((("blank", r"^\s*$"), ("progress", r"\d+%\|")), default="chatter", ray="worker")

    def metric_kind(self, cleaned: pl.Expr, raw_chars: pl.Expr) -> pl.Expr:
        return pl.when(cleaned.str.starts_with("iter ")).then(pl.lit("dirty"))

    def parse(self, ctx, lines):
        rows = []
        for line_no, cleaned, raw in lines.filter(pl.col("kind") == "dirty").select("line_no", "c", "raw").iter_rows():
            head, _, body = cleaned.partition(" | ")
            pairs = [pair.split("=", 1) for pair in body.split()]
            if not head[5:].isdigit() or not pairs or any(len(pair) != 2 for pair in pairs):
                ctx.reject(line_no, "not an iter line", raw, code="unparsable-line")
                continue
            rows.extend((line_no, int(head[5:]), index, key, float(value), None, value)
                        for index, (key, value) in enumerate(pairs, start=1))
        return ParsedMetrics.from_rows(rows)


def test_a_new_grammar_gets_cleaning_noise_segments_and_accounting(store, tmp_path):
    log = tmp_path / "train.log"
    log.write_bytes(
        b"\x1b[36m(Trainer pid=3)\x1b[0m iter 1 | loss=0.5 lr=1 [repeated 2x across cluster]\n"
        b"\n"
        b" 10%|#   | 1/10\riter 2 | loss=0.4\n"
        b"(Worker pid=9) loading shard\n"
        b"iter 3 | loss\n"
        b"hello\n"
        b"iter 1 | loss=0.9\n"
        b"\x00\x00\n"
    )
    ctx = FileContext(con=store, path=log, run_id=1, file_id=1, run_name="r")
    load_console(ctx, IterGrammar())
    ctx.flush()
    assert (ctx.lines, ctx.stored, ctx.ignored_total, ctx.rejected) == (8, 3, 3, 2)
    assert dict(ctx.ignored) == {"blank": 1, "worker": 1, "chatter": 1}
    assert store.execute("SELECT segment, step, key, value FROM step_metrics ORDER BY line_no, key").fetchall() == [
        (0, 1, "loss", 0.5), (0, 1, "lr", 1.0), (0, 2, "loss", 0.4), (1, 1, "loss", 0.9)]
    assert store.execute("SELECT segment, step, flag FROM step_flags").fetchall() == [(1, 1, "restart")]
    assert store.execute("SELECT line_no, reason FROM ingest_errors ORDER BY line_no").fetchall() == [
        (5, "not an iter line"), (8, "line holds NUL bytes and no text")]


@pytest.mark.parametrize("segment", [0, 3])
def test_a_lone_line_segment_is_what_line_segments_gives_for_the_line_alone(segment):
    pairs = pl.DataFrame([(10, 5, 1, "a", 1.0, None, None), (10, 5, 2, "b", 2.0, None, None)],
                         schema=metric_schema(), orient="row")
    expected = line_segments(pairs, resumes=[4]).with_columns(pl.col("segment") + segment)
    assert_frame_equal(lone_line_segment(10, 5, segment), expected)


def test_a_step_printed_in_canonical_form_is_the_step_the_shared_rule_reads():
    """`check_steps` skips `base.step_sql` for steps printed as short canonical integers: each such
    text must read as its integer by that rule, and every text the rule reads otherwise (a sign, a
    leading zero, a decimal point, ten digits, out of range) must not look canonical."""
    import re

    import duckdb

    from polytrace_cli.ingest.base import step_sql
    from polytrace_cli.ingest.console.pipeline import CANONICAL_STEP

    canonical = ["0", "1", "-1", "42", "999999999", "-999999999", "123456789"]
    other = ["+5", "007", "-0", "3.0", "1e3", "1000000000", "2147483648", " 5", "5 ", "", "٣"]
    con = duckdb.connect()
    read = dict(con.execute(f"SELECT t, {step_sql('t')} FROM (SELECT unnest(?::VARCHAR[]) AS t)",
                            [canonical + other]).fetchall())
    assert all(re.fullmatch(CANONICAL_STEP, text) and read[text] == int(text) for text in canonical)
    assert not any(re.search(CANONICAL_STEP, text) for text in other)


@pytest.mark.parametrize("first_step, flags", [(1, []), (3, [(3, "resumed")])])
def test_a_log_of_one_segment_gets_only_its_resumed_flag(tmp_path, first_step, flags):
    from polytrace_cli.ingest.driver import ingest_paths
    from polytrace_cli.store import open_store

    log = tmp_path / "run" / "train.log"
    log.parent.mkdir()
    log.write_text("".join(f"step:{step} - timing_s/step:{step}.5\n" for step in range(first_step, first_step + 4)))
    con = open_store(tmp_path / "s.duckdb")
    ingest_paths(con, [log], format_name="verl-console")
    assert con.execute("SELECT step, flag FROM step_flags ORDER BY step").fetchall() == flags
    con.close()
