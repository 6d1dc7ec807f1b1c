"""The registry of input formats: sniffing a file and finding its ingester.

Ingesters are tried in registration order; the first whose `sniff` accepts the file wins, so
specific formats (a PolyTrace trace recognised by its file name) are registered before general
ones (any text log).
"""

from __future__ import annotations

import codecs

from pathlib import Path

from polytrace_cli.ingest.base import Ingester
from polytrace_cli.ingest.files import is_log_like

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
    the first line is not shown to the sniffers: it is not part of the line. A sniffer that fails on
    odd bytes (it should not) counts as a no: one file's head never stops the command."""
    head = head.removeprefix(codecs.BOM_UTF8)
    for ingester in all_ingesters():
        try:
            accepted = ingester.sniff(path, head)
        except Exception:
            accepted = False
        if accepted:
            return ingester
    return None


# How far into a log-like file (`files.is_log_like`) sniffing looks for its first record.
DEEP_SNIFF_BYTES = 32 << 20


def detect_deep(name_path: Path, text_path: Path, head: bytes) -> Ingester | None:
    """`detect` on the first block; for a log-like file (`is_log_like`) whose first block sniffs as
    nothing, `detect` on each following block of `text_path` (each cut to start at a line) up to
    DEEP_SNIFF_BYTES. A block of binary junk is passed over like any other."""
    found = detect(name_path, head)
    if found is not None or not is_log_like(name_path) or len(head) < SNIFF_BYTES:
        return found
    with open(text_path, "rb") as handle:
        handle.seek(len(head))
        read = len(head)
        carry = head[head.rfind(b"\n") + 1:]  # the start of a line the next block ends
        skipping = b"\n" not in head  # inside a line longer than a block: passed over
        while read < DEEP_SNIFF_BYTES:
            block = handle.read(SNIFF_BYTES)
            if not block:
                return detect(name_path, carry) if carry and not skipping else None
            read += len(block)
            if skipping:
                cut = block.find(b"\n")
                if cut < 0:
                    continue
                block, carry, skipping = block[cut + 1:], b"", False
            window = carry + block
            end = window.rfind(b"\n") + 1
            if end:
                found = detect(name_path, window[:end])
                if found is not None:
                    return found
            carry = window[end:]
            if len(carry) >= SNIFF_BYTES:
                carry, skipping = b"", True
    return None
