"""The registry of input formats: sniffing a file and finding its ingester.

Ingesters are tried in registration order; the first whose `sniff` accepts the file wins, so
specific formats (a PolyTrace trace recognised by its file name) are registered before general
ones (any text log).
"""

from __future__ import annotations

import codecs

from pathlib import Path

from polytrace_cli.ingest.base import Ingester

SNIFF_BYTES = 64 * 1024

_REGISTRY: list[Ingester] = []


def register(ingester_class: type[Ingester]) -> type[Ingester]:
    """Class decorator adding an ingester to the registry."""
    instance = ingester_class()
    if any(existing.name == instance.name for existing in _REGISTRY):
        raise ValueError(f"duplicate ingester name {instance.name!r}")
    _REGISTRY.append(instance)
    return ingester_class


def _load_builtin_formats() -> None:
    # Importing the package registers every built-in ingester, in the order it lists them.
    import polytrace_cli.ingest.formats  # noqa: F401


def all_ingesters() -> list[Ingester]:
    """Every registered ingester, in sniffing order."""
    _load_builtin_formats()
    return list(_REGISTRY)


def get_ingester(name: str) -> Ingester | None:
    """The ingester named `name` (the --format value), or None."""
    return next((i for i in all_ingesters() if i.name == name), None)


def read_head(path: Path) -> bytes:
    """The first bytes of a file, enough for every sniffer."""
    with open(path, "rb") as handle:
        return handle.read(SNIFF_BYTES)


def is_binary(head: bytes) -> bool:
    """True when clean text lines hold less than half of the first bytes.

    A clean line holds no NUL byte and decodes as UTF-8 (the last line may end in a multi-byte
    character cut by the sniff window). A text log with a few bad lines (a zero-filled block left
    by a crash, a stray byte that is not UTF-8) stays text; each bad line is the ingester's to
    reject.
    """
    if not head:
        return False
    lines = head.split(b"\n")
    clean = 0
    for index, line in enumerate(lines):
        if b"\x00" in line:
            continue
        try:
            line.decode("utf-8")
        except UnicodeDecodeError as error:
            if index < len(lines) - 1 or error.start < len(line) - 4:
                continue
        clean += len(line) + 1
    return clean < len(head) / 2


def detect(path: Path, head: bytes) -> Ingester | None:
    """The first registered ingester that accepts the file, or None. A UTF-8 byte order mark before
    the first line is not shown to the sniffers: it is not part of the line."""
    head = head.removeprefix(codecs.BOM_UTF8)
    for ingester in all_ingesters():
        if ingester.sniff(path, head):
            return ingester
    return None
