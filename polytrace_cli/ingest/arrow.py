"""Handing polars frames to DuckDB."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import polars as pl


class ArrowStream:
    """A polars frame as an Arrow C stream, for `duckdb.register`.

    DuckDB reads the frame through the Arrow PyCapsule interface, each query afresh, without
    converting it to a pyarrow table (which would import pyarrow and copy every string).
    """

    def __init__(self, frame: pl.DataFrame):
        self.frame = frame

    def __arrow_c_stream__(self, requested_schema: object | None = None) -> object:
        return self.frame.__arrow_c_stream__(requested_schema)
