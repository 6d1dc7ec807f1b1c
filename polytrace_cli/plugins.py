"""Loading what other installed packages add to polytrace through entry points (`polytrace.formats`,
`polytrace.analyses`)."""

from __future__ import annotations

from collections.abc import Callable

from polytrace_cli.errors import PolytraceError


def load_plugins(group: str, what: str, loaded: Callable[[object], None]) -> None:
    """Load every entry point of `group` in name order and hand each loaded object to `loaded`. A plugin
    that cannot be loaded is a one-line error naming it ("<what> plugin NAME (VALUE) cannot be loaded: ...")."""
    from importlib.metadata import entry_points

    for point in sorted(entry_points(group=group), key=lambda p: p.name):
        try:
            loaded(point.load())
        except Exception as error:  # a broken plugin is named, never a traceback
            raise PolytraceError(f"{what} plugin {point.name} ({point.value}) cannot be loaded: "
                                 f"{type(error).__name__}: {error}") from None
