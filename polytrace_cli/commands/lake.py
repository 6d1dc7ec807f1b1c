"""`polytrace lake`: the store written as a Parquet lake partitioned by table and run."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from polytrace_cli.commands.common import DbOption, JsonOption, console, err_console, user_errors


@user_errors
def lake(
    out: Annotated[Path, typer.Argument(help="Folder of the lake (created; updated when it holds one).")],
    runs: Annotated[list[str] | None, typer.Argument(help="Only these runs (default: every run).")] = None,
    prune: Annotated[bool, typer.Option("--prune", help="Remove runs from the lake that the store no longer holds.")]
    = False,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Write the store as Parquet (OUT/<table>/run=<name>/) with a manifest; rewrites only changed runs."""
    from polytrace_cli.facade import Store

    with Store.open(db, read_only=True) as store:
        result = store.write_lake(out, runs, prune=prune)
    if as_json:
        sys.stdout.write(json.dumps(result.__dict__, indent=2) + "\n")
        return
    console.print(f"{out}: {len(result.written)} run(s) written, {len(result.unchanged)} unchanged, "
                  f"{result.files} file(s), {result.rows:,} rows, {result.seconds:.2f} s", highlight=False)
    if result.written:
        console.print("written: " + ", ".join(result.written), highlight=False)
    if result.removed:
        console.print("removed (no longer in the store): " + ", ".join(result.removed), highlight=False)
    if result.stale:
        err_console.print(f"[yellow]kept {len(result.stale)} run(s) no longer in the store:[/] "
                          + ", ".join(result.stale) + " (--prune removes them)", highlight=False)
