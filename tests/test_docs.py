"""The documentation stays true to the code: links resolve, every analysis column and every
command option is described, and nothing user-facing points outside the project."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import typer.main

from polytrace_cli.analyze.common import StepRange
from polytrace_cli.analyze.registry import all_analyses
from polytrace_cli.cli import COMMANDS, app

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
USER_FACING = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
CODE_BLOCK = re.compile(r"```.*?```", re.S)


def _anchor(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading: lower case, punctuation dropped, spaces to '-'."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    return {_anchor(line.lstrip("#")) for line in path.read_text().splitlines() if line.startswith("#")}


def _links(path: Path) -> list[str]:
    return LINK.findall(CODE_BLOCK.sub("", path.read_text()))


def test_every_relative_link_resolves():
    broken = []
    for page in USER_FACING:
        for target in _links(page):
            if re.match(r"[a-z]+:", target):
                continue  # http(s), mailto: not checked here
            file_part, _, anchor = target.partition("#")
            resolved = (page.parent / file_part).resolve() if file_part else page
            if not resolved.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert broken == []


def test_the_link_checker_catches_a_broken_link(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Title\n[ok](page.md#title) [missing](nope.md) `[not](in-code.md)`\n"
                    "```sh\n[inside](a-code-block.md)\n```\n")
    assert _links(page) == ["page.md#title", "nope.md", "in-code.md"]
    assert "title" in _anchors(page)


def test_nothing_user_facing_points_outside_the_project():
    offending = [str(page.relative_to(ROOT)) for page in USER_FACING
                 if "../shared" in page.read_text() or "shared/data" in page.read_text()]
    assert offending == []


def _sections(text: str) -> dict[str, str]:
    """Level-2 headings of a page -> the text under them."""
    parts = re.split(r"^## (.+)$", text, flags=re.M)
    return {parts[i].strip(): parts[i + 1] for i in range(1, len(parts), 2)}


def test_every_analysis_column_is_described_in_metrics(store):
    sections = _sections((DOCS / "metrics.md").read_text())
    missing = {}
    for name, analysis in all_analyses().items():
        assert name in sections, f"docs/metrics.md has no '## {name}' section"
        # The columns of the summary as the analysis returns it, from an empty store.
        columns = analysis.summary(store, [], StepRange()).columns
        listed = set(re.findall(r"`([a-z0-9_]+)`", sections[name]))
        absent = [column for column in columns if column not in listed]
        if absent:
            missing[name] = absent
    assert missing == {}, f"add these columns to docs/metrics.md: {missing}"


def test_analysis_sections_follow_the_registry_order():
    names = list(all_analyses())
    headings = [h for h in _sections((DOCS / "metrics.md").read_text()) if h in names]
    assert headings == names


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_has_a_page_naming_each_option(command):
    page = DOCS / "commands" / f"{command}.md"
    assert page.exists(), f"write docs/commands/{command}.md"
    text = page.read_text()
    assert text.startswith(f"# polytrace {command}\n")
    click_command = typer.main.get_command(app).commands[command]
    options = [flag for param in click_command.params if param.param_type_name == "option"
               for flag in param.opts if flag.startswith("--")]
    assert [flag for flag in options if f"`{flag}`" not in text] == []
    assert f"[{command}](commands/{command}.md)" in (DOCS / "README.md").read_text()
