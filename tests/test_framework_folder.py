"""The recipe "How to add a framework folder" of docs/architecture.md, followed in a copy of the package: a
new framework's console format is two files in `ingest/formats/<framework>/` (its metric names and its
module) besides its fixture (`tests/fixtures/framework_folder/train.log`) and this test. Nothing else in
the package changes: the format is found, sniffed before verl's general console log, and its names reach
the `steps` view."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "framework_folder" / "train.log"
FIXTURES_TRL = ROOT / "tests" / "fixtures" / "trl"

NAMES = '''"""acme's metric names: imports nothing."""

METRIC_ALIASES = {"rollout_s": "gen_s", "total_s": "step_s"}
VALIDATION_PREFIXES = ("eval_",)
FORMATS = ("acme-console",)
'''

CONSOLE = '''"""acme console log: `[acme] iter N | key=value | ...` lines among other output."""

from pathlib import Path

from polytrace_cli.errors import ErrorCode
from polytrace_cli.ingest.base import FileContext, Ingester
from polytrace_cli.ingest.console import ConsoleGrammar, ParsedMetrics, load_console
from polytrace_cli.ingest.console_lines import parse_scalar
from polytrace_cli.ingest.formats.acme import names
from polytrace_cli.ingest.registry import is_binary, register

ANCHOR = "[acme] iter "


class AcmeGrammar(ConsoleGrammar):
    anchor = ANCHOR

    def metric_kind(self, cleaned, raw_chars):
        import polars as pl

        return pl.when(cleaned.str.starts_with(ANCHOR)).then(pl.lit("metric"))

    def parse(self, ctx: FileContext, lines) -> ParsedMetrics:
        rows = []
        for line_no, text, kind in lines.select("line_no", "c", "kind").iter_rows():
            if kind != "metric":
                continue
            head, *pairs = text.split(" | ")
            step = head.removeprefix(ANCHOR).strip()
            if not step.isdigit():
                ctx.reject(line_no, f"iteration is not a number: {step!r}", text, code=ErrorCode.UNPARSABLE_LINE)
                continue
            for index, pair in enumerate(pairs):
                key, _, printed = pair.partition("=")
                value, text_value = parse_scalar(printed)
                rows.append((line_no, step, index, key, value, text_value, printed))
        return ParsedMetrics.from_rows(rows)


@register
class AcmeConsoleIngester(Ingester):
    name = "acme-console"
    version = "1"
    framework = "acme"
    description = "acme trainer stdout"
    metric_aliases = names.METRIC_ALIASES
    validation_prefixes = names.VALIDATION_PREFIXES

    def sniff(self, path: Path, head: bytes) -> bool:
        return not is_binary(head) and b"[acme] iter " in head

    def load(self, ctx: FileContext) -> None:
        load_console(ctx, AcmeGrammar())
'''

CHECK = '''
import json, sys
from polytrace_cli import Store
from polytrace_cli.ingest.sniffing import all_ingesters

with Store.open(sys.argv[1]) as store:
    [report] = store.ingest([sys.argv[2]], run="acme-run")
    steps = store.connection.execute(
        "SELECT step, gen_s, step_s, is_validation_only FROM steps ORDER BY step").fetchall()
names = [i.name for i in all_ingesters()]
print(json.dumps({"report": [report.format, report.status, report.lines, report.stored, report.ignored,
                             report.rejected], "steps": steps,
                  "acme_before_verl": names.index("acme-console") < names.index("verl-console")}))
'''


def test_a_framework_folder_is_two_files_in_the_package(tmp_path):
    copy = tmp_path / "site" / "polytrace_cli"
    shutil.copytree(ROOT / "polytrace_cli", copy, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "schemas", copy / "schemas", ignore=shutil.ignore_patterns("__pycache__"))
    before = {path.relative_to(copy) for path in copy.rglob("*") if path.is_file()}
    folder = copy / "ingest" / "formats" / "acme"
    folder.mkdir()
    (folder / "names.py").write_text(NAMES)
    (folder / "console.py").write_text(CONSOLE)
    added = {path.relative_to(copy) for path in copy.rglob("*") if path.is_file()} - before
    assert sorted(map(str, added)) == ["ingest/formats/acme/console.py", "ingest/formats/acme/names.py"]
    done = subprocess.run([sys.executable, "-c", CHECK, str(tmp_path / "s.duckdb"), str(FIXTURE)],
                          env={"PYTHONPATH": str(copy.parent), "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    # 6 lines: 3 metric lines stored, 1 rejected (`iter x`), 2 other lines ignored.
    assert result["report"] == ["acme-console", "ingested", 6, 3, 2, 1]
    assert result["steps"] == [[1, 12.5, 20.0, False], [2, 14.0, 22.0, False], [3, None, None, True]]
    assert result["acme_before_verl"]


def test_the_built_in_formats_are_sniffed_in_their_order():
    # The order the formats package gave before its folders (import order then): specific formats first;
    # the formats of the other framework folders next, in module order; the general readers last: a Chrome
    # trace (JSON any profiler writes), then verl's console log, which reads any `step:N - key:value` text.
    from polytrace_cli.ingest.formats import format_modules
    from polytrace_cli.ingest.sniffing import all_ingesters

    builtin = [i for i in all_ingesters() if type(i).__module__.startswith("polytrace_cli.")]
    names = [i.name for i in builtin]
    assert names[:19] == [
        "polytrace-packed", "polytrace-reward", "polytrace-dapo-filter", "polytrace-multiturn", "polytrace-dataset",
        "verl-jsonl", "verl-rollout", "openrlhf-console", "trl-console", "tensorboard-events", "trl-trainer-state",
        "wandb-config", "wandb-summary", "mlflow-metric", "mlflow-run-file", "mlflow-sqlite", "wandb-offline",
        "wandb-table", "wandb-csv"]
    assert names[-3:] == ["chrome-trace", "chrome-trace-jsonl", "verl-console"]
    # Whatever imported which module first (trl's trainer_state imports TensorBoard's reader), the order is
    # `format_modules`'.
    order = {module: index for index, module in enumerate(format_modules())}
    positions = [order[type(i).__module__.removeprefix("polytrace_cli.ingest.formats.")] for i in builtin]
    assert positions == sorted(positions)


def test_each_built_in_format_is_listed_with_its_module():
    # `--format NAME` imports FORMAT_MODULES[NAME] alone: the table must name every built-in format's module.
    from polytrace_cli.ingest.formats import FORMAT_MODULES, load_builtin_format
    from polytrace_cli.ingest.sniffing import all_ingesters, get_ingester

    builtin = {i.name: type(i).__module__.removeprefix("polytrace_cli.ingest.formats.")
               for i in all_ingesters() if type(i).__module__.startswith("polytrace_cli.")}
    assert FORMAT_MODULES == builtin
    assert not load_builtin_format("no-such-format")
    assert get_ingester("no-such-format") is None
    assert type(get_ingester("trl-console")).__name__ == "TrlConsoleIngester"


def test_a_named_format_imports_its_own_module_alone(tmp_path):
    # `ingest --format trl-console` imports the TRL console reader (and the OpenRLHF one it borrows a
    # literal parser from), no other format's module, and not numpy (the trace readers' import).
    probe = (
        "import sys\n"
        "from polytrace_cli.cli import main\n"
        f"sys.argv = ['polytrace', 'ingest', '--format', 'trl-console', {str(FIXTURES_TRL / 'grpo_no_bar.log')!r},"
        f" '--db', {str(tmp_path / 's.duckdb')!r}]\n"
        "try:\n    main()\nexcept SystemExit as done:\n    assert not done.code, done.code\n"
        "prefix = 'polytrace_cli.ingest.formats.'\n"
        "print(sorted(m[len(prefix):] for m in sys.modules if m.startswith(prefix) and not m.endswith(('.names', '__init__'))"
        " and m.count('.') == 4), 'numpy' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=tmp_path).stdout
    assert out.strip().splitlines()[-1] == "['openrlhf.console', 'trl.console', 'trl.logged'] False"
