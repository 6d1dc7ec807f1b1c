"""The recipes and the layout the docs give stay true: every project path the docs name exists, every
registered format has its row in docs/formats.md, and each recipe of docs/architecture.md ends in the test
that proves it."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
PROJECT_TOPS = {"polytrace_cli", "tests", "benchmarks", "schemas", "docs", "examples", "sample_logs"}
PACKAGES = {path.name for path in (ROOT / "polytrace_cli").iterdir() if path.is_dir() and path.name != "__pycache__"}
# Where a path the docs name may start: the project, the package, and the ingest engine (`formats/...`).
BASES = (ROOT, ROOT / "polytrace_cli", ROOT / "polytrace_cli" / "ingest")
TICKED = re.compile(r"`([^`\s]+)`")


def named_paths(text: str) -> list[str]:
    """The project paths a page names in backticks: with a folder, starting at a project folder or a package
    of polytrace_cli; a placeholder (`<format>`, `*`, `fNN_`, `{...}`) is a pattern, not a path."""
    found = []
    for token in TICKED.findall(text):
        token = token.rstrip(".,:;)").split(":")[0]
        if "/" not in token or any(mark in token for mark in "<>*{}") or "NN" in token or "..." in token:
            continue
        if token.split("/")[0] in PROJECT_TOPS | PACKAGES:
            found.append(token)
    return found


def missing_paths(pages: list[Path], bases: tuple[Path, ...] = BASES) -> list[str]:
    return [f"{page.name}: {token}" for page in pages for token in named_paths(page.read_text())
            if not any((base / token).exists() for base in bases)]


def test_every_path_the_docs_name_exists():
    assert missing_paths(PAGES) == []


def test_the_path_check_sees_a_path_that_is_gone(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("Aliases live in `ingest/formats/verl_names.py`; see `store/catalog.py`, "
                    "`formats/<framework>/names.py` and `wandb/run-*/files/`.\n")
    assert named_paths(page.read_text()) == ["ingest/formats/verl_names.py", "store/catalog.py"]
    assert missing_paths([page]) == ["page.md: ingest/formats/verl_names.py"]


def _formats_table_names() -> set[str]:
    text = (ROOT / "docs" / "formats.md").read_text()
    return {name for line in text.splitlines() if line.startswith("| `")
            for name in re.findall(r"`([a-z0-9-]+)`", line.split("|")[1])}


def test_every_registered_format_has_a_row_in_the_formats_table():
    from polytrace_cli.ingest.sniffing import all_ingesters

    builtin = {i.name for i in all_ingesters() if type(i).__module__.startswith("polytrace_cli.")}
    assert builtin and builtin - _formats_table_names() == set()


RECIPE = re.compile(r"^## (How to add .*)$", re.M)
PROVED_BY = re.compile(r"`(tests/test_\w+\.py)`")


def recipes(text: str) -> dict[str, str]:
    """{heading: the recipe's last paragraph} of every `## How to add ...` section."""
    parts = RECIPE.split(text)
    return {parts[i]: parts[i + 1].strip().split("\n\n")[-1] for i in range(1, len(parts), 2)}


def test_each_recipe_ends_in_the_test_that_proves_it():
    found = recipes((ROOT / "docs" / "architecture.md").read_text())
    for recipe in ("an analysis", "a figure", "a file format", "a framework folder", "a tracker"):
        assert f"How to add {recipe}" in found, recipe
    unproved = {}
    for heading, last in found.items():
        proofs = PROVED_BY.findall(last)
        if not last.startswith("Proved by") or not proofs or not all((ROOT / proof).is_file() for proof in proofs):
            unproved[heading] = last[:120]
    assert unproved == {}
