"""Errors a user can cause. The CLI prints their message on one line and exits non-zero."""


class PolytraceError(Exception):
    """A failure with a message meant for the user, not a bug."""

    exit_code = 2


class StoreError(PolytraceError):
    """The store cannot be opened, migrated or written."""


class IngestError(PolytraceError):
    """A file cannot be ingested as a whole (binary, unknown format, unreadable).

    `code` is the file's `ingest_errors.code` (see polytrace_cli.ingest.base.ERROR_CODES).
    """

    def __init__(self, message: str, code: str = "corrupt-file"):
        super().__init__(message)
        self.code = code
