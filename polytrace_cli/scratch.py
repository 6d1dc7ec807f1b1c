"""The store's scratch folder: where an ingest writes the copies it reads instead of its inputs, beside
the store file and never in the system's temporary folder (`scratch_folder`); what a killed ingest left
there is removed at the next writer's open (`clear_scratch`). The standard library only."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

# The private folder beside a store (`<store>.scratch/`) holding the copies an ingest reads instead
# of its inputs: decompressed or rewritten texts, the appended part of a log, a trace's pieces. Not
# DuckDB's own `<store>.tmp/`, which DuckDB removes whole when it made it. Each ingesting process
# works in a folder of its own in it, `<pid>-...`.
SCRATCH_SUFFIX = ".scratch"


def scratch_root(store: str | os.PathLike) -> Path:
    """The folder beside the store file `store` an ingest's copies are written in."""
    store = Path(store)
    return store.with_name(store.name + SCRATCH_SUFFIX)


@contextmanager
def scratch_folder(store: str | os.PathLike | None, prefix: str = "read") -> Iterator[Path]:
    """A new, empty folder private to this process, removed with what it holds afterwards: inside
    `scratch_root(store)` (itself removed when it is left empty), or in the system's temporary
    folder for a store held in memory (`store` None)."""
    if store is None:
        folder = Path(tempfile.mkdtemp(prefix=f"polytrace-{prefix}-"))
        root = None
    else:
        root = scratch_root(store)
        root.mkdir(mode=0o700, exist_ok=True)
        try:
            folder = Path(tempfile.mkdtemp(prefix=f"{os.getpid()}-{prefix}-", dir=root))
        except FileNotFoundError:  # another thread removed the root, left empty, in between
            root.mkdir(mode=0o700, exist_ok=True)
            folder = Path(tempfile.mkdtemp(prefix=f"{os.getpid()}-{prefix}-", dir=root))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        if root is not None:
            try:
                root.rmdir()
            except OSError:
                pass  # another of this process's folders is still in it, or it is gone already


def clear_scratch(store: str | os.PathLike) -> None:
    """Remove what a killed ingest left in `scratch_root(store)`: every folder another process made
    (the caller holds the store's write lock, so no other process is ingesting into it), and the
    root when it is then empty."""
    root = scratch_root(store)
    try:
        entries = list(os.scandir(root))
    except OSError:
        return
    mine = f"{os.getpid()}-"
    for entry in entries:
        if entry.name.startswith(mine):
            continue
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path, ignore_errors=True)
        else:
            try:
                os.unlink(entry.path)
            except OSError:
                pass
    try:
        root.rmdir()
    except OSError:
        pass
