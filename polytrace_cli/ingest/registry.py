"""The registry of input formats: each format module registers its ingester here (`register`) as it is
imported, plugins through the `polytrace.formats` entry points; and the formats' metric names, which the
store is handed (`declared_metric_names`). Finding the ingester of a file is `sniffing`'s.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from polytrace_cli.errors import PolytraceError
from polytrace_cli.ingest.base import Ingester
from polytrace_cli.semantics import execution_mode
from polytrace_cli.store.catalog import SHARED, hand_down


_REGISTRY: list[Ingester] = []
_PLUGINS: list[Ingester] = []
_plugins_loaded = False

# The entry-point group through which another package adds formats: each entry point names a module
# whose import registers its ingesters with `@register` (or an `Ingester` subclass, registered here).
ENTRY_POINT_GROUP = "polytrace.formats"


def metric_name_modules() -> list[str]:
    """The modules `ingest/formats/<framework>/names.py` that declare a built-in framework's metric names
    (`METRIC_ALIASES`, `VALIDATION_PREFIXES`) and load nothing else: opening a store checks its `steps`
    view against them without loading every format (see `declared_metric_names`)."""
    formats = Path(__file__).parent / "formats"
    return [f"polytrace_cli.ingest.formats.{path.parent.name}.names" for path in sorted(formats.glob("*/names.py"))]


def names_module(name: str):
    """The names module `name` (one of `metric_name_modules()`), loaded alone: a framework folder's
    `names.py` is executed without its package, whose import would register every format."""
    import importlib
    import importlib.util
    import sys

    if name in sys.modules or not name.startswith("polytrace_cli.ingest.formats."):
        return importlib.import_module(name)
    framework = name.split(".")[-2]
    spec = importlib.util.spec_from_file_location(name, Path(__file__).parent / "formats" / framework / "names.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def register(ingester_class: type[Ingester]) -> type[Ingester]:
    """Class decorator adding an ingester to the registry. Its `metric_aliases` must give each key one valid
    canonical name (`format_names`), and a built-in format's must be its framework's `names.py` (the store's
    views are built from those modules alone), which lists the format in its `FORMATS`: either fault is a
    one-line error here, not a name the view drops without a word."""
    instance = ingester_class()
    if any(existing.name == instance.name for existing in (*_PLUGINS, *_REGISTRY)):
        raise ValueError(f"duplicate ingester name {instance.name!r}")
    if instance.name == SHARED:
        raise PolytraceError(f"no format may be named {SHARED!r}: the store keeps the names every format shares so")
    format_names(f"format {instance.name}", instance.metric_aliases)
    _check_declared_in_names(instance)
    _REGISTRY.append(instance)
    return ingester_class


# A canonical name: a column of the `steps` view or a name analyses look up, written into SQL as an identifier.
_CANONICAL = re.compile(r"[a-z][a-z0-9_]*")


def format_names(source: str, aliases) -> dict[str, str]:
    """The names `source` (a format, or a framework's names module) declares, as key -> canonical: from a
    mapping, or from (key, canonical) pairs. A key that is not a non-empty string, a canonical name that is
    not a lowercase identifier (`[a-z][a-z0-9_]*`), or one key given two canonical names is a one-line error."""
    pairs = aliases.items() if isinstance(aliases, Mapping) else aliases
    names: dict[str, str] = {}
    for pair in pairs:
        if not (isinstance(pair, tuple | list) and len(pair) == 2):
            raise PolytraceError(f"{source}: metric_aliases holds {pair!r}, not a (key, canonical name) pair")
        key, canonical = pair
        if not isinstance(key, str) or not key:
            raise PolytraceError(f"{source} maps {key!r}, which is not a metric key (a non-empty string)")
        if not isinstance(canonical, str) or not _CANONICAL.fullmatch(canonical):
            raise PolytraceError(f"{source} maps {key!r} to {canonical!r}, which is not a canonical name"
                                 " (lowercase letters, digits and underscores, from a letter)")
        if names.setdefault(key, canonical) != canonical:
            raise PolytraceError(f"{source} maps {key!r} to both {names[key]!r} and {canonical!r}: a format gives"
                                 " a key one meaning")
    return names


def _check_declared_in_names(ingester: Ingester) -> None:
    module = type(ingester).__module__
    parts = module.split(".")
    if not module.startswith("polytrace_cli.ingest.formats.") or len(parts) < 5 or not ingester.metric_aliases:
        return
    import importlib

    names_module = ".".join(parts[:4]) + ".names"
    try:
        loaded = importlib.import_module(names_module)
    except ModuleNotFoundError:
        loaded = None
    declared = getattr(loaded, "METRIC_ALIASES", {})
    if loaded is not None and loaded.__file__:
        check_names_literal(names_module, Path(loaded.__file__))
    own = format_names(f"format {ingester.name}", ingester.metric_aliases)
    for key, canonical in own.items():
        if declared.get(key) != canonical:
            raise PolytraceError(f"format {ingester.name} maps {key!r} to {canonical!r}, which {names_module} does not"
                                 " declare: the steps view reads a framework's names from its names.py only")
    if own != dict(declared):
        missing = sorted(set(declared) - set(own))
        raise PolytraceError(f"format {ingester.name} does not map {missing[0]!r}, which {names_module} declares:"
                             " a built-in format's metric_aliases are its framework's METRIC_ALIASES")
    if ingester.name not in getattr(loaded, "FORMATS", ()):
        raise PolytraceError(f"format {ingester.name} maps metric keys but {names_module} does not list it in"
                             " FORMATS: the steps view would read its files without its names")


def check_names_literal(names_module: str, path: Path) -> None:
    """Refuse a names module whose METRIC_ALIASES literal gives one key twice with two canonical names
    (Python keeps the last silently)."""
    import ast

    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        if not any(isinstance(t, ast.Name) and t.id == "METRIC_ALIASES" for t in targets):
            continue
        if isinstance(node.value, ast.Dict):
            format_names(names_module, [(ast.literal_eval(k), ast.literal_eval(v)) for k, v in
                                        zip(node.value.keys, node.value.values) if k is not None
                                        and isinstance(k, ast.Constant) and isinstance(v, ast.Constant)])


def builtin_ingesters() -> list[Ingester]:
    """The built-in ingesters registered so far, in registration order (every one once `sniffing` has
    loaded the formats)."""
    return list(_REGISTRY)


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


def names_by_format(sources: list[tuple[str, list[str], object, tuple[str, ...]]]
                    ) -> tuple[dict[str, dict[str, str]], tuple[str, ...]]:
    """(format -> key -> canonical, validation prefixes) from (source, its formats, its aliases, its validation
    prefixes): each format's names checked (`format_names`), formats in name order, the prefixes of every
    source together. Two sources naming one format is an error (which of them the format reads is unknown);
    two formats giving one key two meanings is not (each file is read with its own format's)."""
    by_format: dict[str, dict[str, str]] = {}
    owner: dict[str, str] = {}
    for source, formats, aliases, _ in sources:
        names = format_names(source, aliases)
        for name in formats:
            if name in owner:
                raise PolytraceError(f"format {name} is given metric names by both {owner[name]} and {source}")
            owner[name] = source
            if names:
                by_format[name] = names
    prefixes = tuple(sorted({prefix for *_, declared in sources for prefix in declared}))
    return dict(sorted(by_format.items())), prefixes


def declared_metric_names() -> tuple[dict[str, dict[str, str]], tuple[str, ...]]:
    """(format -> key -> canonical, validation prefixes) of every format: the built-in frameworks'
    `metric_name_modules()` (a module's `METRIC_ALIASES` for each format of its `FORMATS`) and the plugins'
    `metric_aliases` and `validation_prefixes`. A format that names no key has no entry (its files read the
    names every format shares, `store.catalog.SHARED`)."""
    sources = []
    for name in metric_name_modules():
        module = names_module(name)
        sources.append((name, list(getattr(module, "FORMATS", ())), module.METRIC_ALIASES, module.VALIDATION_PREFIXES))
    sources += [(f"format {i.name}", [i.name], i.metric_aliases, tuple(i.validation_prefixes))
                for i in plugin_ingesters()]
    return names_by_format(sources)


# The store generates its `steps` view from these names; loading the registry hands them down, so that every
# store this process opens (also with `store.open_store`) knows the formats it ingests.
hand_down(declared_metric_names)


def declared_execution_mode_keys() -> dict[str, str]:
    """Key prefix -> execution mode, from every built-in framework's `EXECUTION_MODE_KEYS` (a framework
    without asynchronous families declares none), in the frameworks' order and each's own: the first
    prefix a run's keys hold decides its mode, so each framework lists its most specific first."""
    import importlib

    keys: dict[str, str] = {}
    for name in metric_name_modules():
        for prefix, mode in getattr(importlib.import_module(name), "EXECUTION_MODE_KEYS", {}).items():
            keys.setdefault(prefix, mode)
    return keys


# The semantics layer tells a run's execution mode from these key families; handed down likewise.
execution_mode.hand_down(declared_execution_mode_keys)


def execution_mode_timers() -> dict[str, tuple[str, str]]:
    """Per execution mode, (what tells it, what its timers mean) (`semantics.execution_mode.MODE_TIMERS`), for
    `polytrace formats`."""
    return dict(execution_mode.MODE_TIMERS)


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


