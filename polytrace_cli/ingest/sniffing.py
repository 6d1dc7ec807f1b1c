"""Which ingester reads a file: every registered format loaded (the plugins' first, then the built-in ones
in their sniffing order) and asked in turn (`detect`, `detect_deep`).

Ingesters are tried in registration order; the first whose `sniff` accepts the file wins, so
specific formats (a PolyTrace trace recognised by its file name) are registered before general
ones (any text log).
"""

from __future__ import annotations

import codecs
import functools
from pathlib import Path

from polytrace_cli.ingest.base import Ingester
from polytrace_cli.ingest.files import is_log_like
from polytrace_cli.ingest.formats import format_modules, load_builtin_format, load_builtin_formats
from polytrace_cli.ingest.registry import builtin_ingesters, names_by_format, plugin_ingesters


SNIFF_BYTES = 64 * 1024


def all_ingesters() -> list[Ingester]:
    """Every registered ingester, in sniffing order: the plugins' first (a team's own format is more
    specific than the general built-in ones), then the built-in formats."""
    plugins = plugin_ingesters()
    load_builtin_formats()
    # In registration order, which is import order: sorted by module (`format_modules`), kept within one; one
    # registered from elsewhere (a test's) first, as a plugin would be.
    builtin = builtin_ingesters()
    global _SORTED
    if _SORTED is None or _SORTED[0] != (len(plugins), len(builtin)):
        order = _module_order()
        _SORTED = ((len(plugins), len(builtin)),
                   [*plugins, *sorted(builtin, key=lambda i: order.get(type(i).__module__, -1))])
    return list(_SORTED[1])


# The last answer of `all_ingesters`, by the number of plugin and built-in ingesters it was sorted from.
_SORTED: tuple[tuple[int, int], list[Ingester]] | None = None


@functools.cache
def _module_order() -> dict[str, int]:
    return {f"polytrace_cli.ingest.formats.{module}": index for index, module in enumerate(format_modules())}


def registered_metric_names() -> tuple[dict[str, dict[str, str]], tuple[str, ...]]:
    """(format -> key -> canonical, validation prefixes) as every registered ingester declares them on its
    class; the same as `declared_metric_names` when each built-in framework's names sit in its
    `ingest/formats/<framework>/names.py`, which lists the framework's formats in `FORMATS`."""
    return names_by_format([(f"format {i.name}", [i.name], i.metric_aliases, tuple(i.validation_prefixes))
                            for i in all_ingesters()])


def get_ingester(name: str) -> Ingester | None:
    """The ingester named `name` (the --format value), or None. A built-in format's module is imported alone
    (`formats.load_builtin_format`); any other name loads every format (a plugin's included)."""
    plugins = plugin_ingesters()
    found = next((i for i in plugins if i.name == name), None)
    if found is None and load_builtin_format(name):
        found = next((i for i in builtin_ingesters() if i.name == name), None)
    if found is not None:
        return found
    return next((i for i in all_ingesters() if i.name == name), None)


def read_head(path: Path) -> bytes:
    """The first bytes of a file, enough for every sniffer."""
    with open(path, "rb") as handle:
        return handle.read(SNIFF_BYTES)


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
