"""Errors a user can cause. The CLI prints their message on one line and exits non-zero."""

from __future__ import annotations

from enum import StrEnum


class ErrorCode(StrEnum):
    """Why a line or a file was quarantined: `ingest_errors.code`, one of docs/errors.md's codes, in its order."""

    INVALID_JSON = "invalid-json"
    NOT_AN_OBJECT = "not-an-object"
    MISSING_FIELD = "missing-field"
    TYPE_ERROR = "type-error"
    OUT_OF_RANGE = "out-of-range"
    CONSTRAINT_ERROR = "constraint-error"
    ENCODING_ERROR = "encoding-error"
    UNPARSABLE_LINE = "unparsable-line"
    UNREADABLE_FILE = "unreadable-file"
    UNKNOWN_FORMAT = "unknown-format"
    BINARY_FILE = "binary-file"
    CORRUPT_FILE = "corrupt-file"



class PolytraceError(Exception):
    """A failure with a message meant for the user, not a bug."""

    exit_code = 2


class StoreError(PolytraceError):
    """The store cannot be opened, migrated or written."""


class IngestError(PolytraceError):
    """A file cannot be ingested as a whole (binary, unknown format, unreadable).

    `code` is the file's `ingest_errors.code` (an `ErrorCode`).
    """

    def __init__(self, message: str, code: ErrorCode = ErrorCode.CORRUPT_FILE):
        super().__init__(message)
        self.code = code
