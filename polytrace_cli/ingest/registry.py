"""The registry of input formats: sniffing a file and finding its ingester.

Ingesters are tried in registration order; the first whose `sniff` accepts the file wins, so
specific formats (a PolyTrace trace recognised by its file name) are registered before general
ones (any text log).
"""

from __future__ import annotations

import codecs
import re
from pathlib import Path

from polytrace_cli.ingest.base import Ingester
from polytrace_cli.ingest.files import is_log_like

SNIFF_BYTES = 64 * 1024

_REGISTRY: list[Ingester] = []
_PLUGINS: list[Ingester] = []
_plugins_loaded = False

# The entry-point group through which another package adds formats: each entry point names a module
# whose import registers its ingesters with `@register` (or an `Ingester` subclass, registered here).
ENTRY_POINT_GROUP = "polytrace.formats"


def metric_name_modules() -> list[str]:
    """The modules `ingest/<framework>_names.py` that declare a built-in framework's metric names
    (`METRIC_ALIASES`, `VALIDATION_PREFIXES`) and load nothing else: opening a store checks its `steps`
    view against them without loading every format (see `declared_metric_names`)."""
    return [f"polytrace_cli.ingest.{path.stem}" for path in sorted(Path(__file__).parent.glob("*_names.py"))]


def register(ingester_class: type[Ingester]) -> type[Ingester]:
    """Class decorator adding an ingester to the registry."""
    instance = ingester_class()
    if any(existing.name == instance.name for existing in (*_PLUGINS, *_REGISTRY)):
        raise ValueError(f"duplicate ingester name {instance.name!r}")
    _REGISTRY.append(instance)
    return ingester_class


def _load_builtin_formats() -> None:
    # Importing the package registers every built-in ingester, in the order it lists them.
    import polytrace_cli.ingest.formats  # noqa: F401


def plugin_ingesters() -> list[Ingester]:
    """The ingesters other installed packages add through the `polytrace.formats` entry points, in entry
    point name order. A plugin that cannot be loaded is an error naming it."""
    global _plugins_loaded
    if not _plugins_loaded:
        from polytrace_cli.plugins import load_plugins

        _plugins_loaded = True

        def add(loaded: object) -> None:
            # A module registers its ingesters as it is imported; an Ingester class is registered here.
            if isinstance(loaded, type) and issubclass(loaded, Ingester) and not any(
                    type(i) is loaded for i in (*_PLUGINS, *_REGISTRY)):
                register(loaded)

        load_plugins(ENTRY_POINT_GROUP, "format", add)
        # A plugin may import built-in formats as it loads: only the ingesters defined outside polytrace move.
        _PLUGINS.extend(i for i in _REGISTRY if not type(i).__module__.startswith("polytrace_cli."))
        _REGISTRY[:] = [i for i in _REGISTRY if i not in _PLUGINS]
    return list(_PLUGINS)


def all_ingesters() -> list[Ingester]:
    """Every registered ingester, in sniffing order: the plugins' first (a team's own format is more
    specific than the general built-in ones), then the built-in formats."""
    plugins = plugin_ingesters()
    _load_builtin_formats()
    return [*plugins, *_REGISTRY]


def _merged_names(sources: list[tuple[str, dict[str, str], tuple[str, ...]]]) -> tuple[dict[str, str], tuple[str, ...]]:
    merged: dict[str, str] = {}
    owner: dict[str, str] = {}
    for source, aliases, _ in sources:
        for key, canonical in aliases.items():
            if merged.setdefault(key, canonical) != canonical:
                raise ValueError(f"metric key {key!r} is {merged[key]!r} in {owner[key]} but {canonical!r} in {source}")
            owner.setdefault(key, source)
    prefixes = tuple(sorted({prefix for _, _, declared in sources for prefix in declared}))
    return dict(sorted(merged.items())), prefixes


def declared_metric_names() -> tuple[dict[str, str], tuple[str, ...]]:
    """(aliases, validation prefixes) of every format: the built-in frameworks' `metric_name_modules()` and
    the plugins' `metric_aliases` and `validation_prefixes`. Aliases map a logged key to its canonical name,
    in key order; a key mapped to two names is an error (the steps view could not say which)."""
    import importlib

    sources = []
    for name in metric_name_modules():
        module = importlib.import_module(name)
        sources.append((name, module.METRIC_ALIASES, module.VALIDATION_PREFIXES))
    sources += [(f"format {i.name}", dict(i.metric_aliases), tuple(i.validation_prefixes)) for i in plugin_ingesters()]
    return _merged_names(sources)


def registered_metric_names() -> tuple[dict[str, str], tuple[str, ...]]:
    """(aliases, validation prefixes) as every registered ingester declares them on its class; the same as
    `declared_metric_names` when each built-in framework's names sit in an `ingest/<framework>_names.py` module."""
    return _merged_names([(f"format {i.name}", dict(i.metric_aliases), tuple(i.validation_prefixes))
                          for i in all_ingesters()])


def get_ingester(name: str) -> Ingester | None:
    """The ingester named `name` (the --format value), or None."""
    return next((i for i in all_ingesters() if i.name == name), None)


def read_head(path: Path) -> bytes:
    """The first bytes of a file, enough for every sniffer."""
    with open(path, "rb") as handle:
        return handle.read(SNIFF_BYTES)


# Characters of a text log: a printable character or whitespace, and the escape that starts a colour code.
_NOT_TEXT = re.compile(r"[\x00-\x07\x0e-\x1a\x1c-\x1f\x7f\ufffd]")
# The share of the head's characters that are not text above which a file is binary.
BINARY_SHARE = 0.3


def is_binary(head: bytes) -> bool:
    """True when the first bytes are not text, judged over the whole head: more than BINARY_SHARE of
    their characters are not text (NUL and other control bytes, bytes that are not UTF-8, each such
    byte one replacement character), and clean lines (no NUL, UTF-8) hold less than half of them.

    A text log with a few bad lines stays text, each bad line the ingester's to reject: one long
    line with a damaged byte (its bytes are nearly all text), a zero-filled block left by a crash
    or a stray byte that is not UTF-8 (most lines are clean).
    """
    if not head:
        return False
    text = head.decode("utf-8", errors="replace")
    if len(_NOT_TEXT.findall(text)) <= BINARY_SHARE * len(text):
        return False
    lines = head.split(b"\n")
    clean = 0
    for index, line in enumerate(lines):
        if b"\x00" in line:
            continue
        try:
            line.decode("utf-8")
        except UnicodeDecodeError as error:
            # The last line may end in a multi-byte character cut by the sniff window.
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
