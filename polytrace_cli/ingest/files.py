"""Finding input files and hashing them, with the standard library only (and `sha_state`).

Hashing and counting lines take a core for about 1.2 s per GB. A file is hashed in a background
thread while DuckDB or polars parse it (`FileHashes`); a log that only grew since it was read is
hashed on from the state kept for its prefix (`hash_range`), so its growth alone is read.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from polytrace_cli.ingest import sha_state
from polytrace_cli.scratch import SCRATCH_SUFFIX, scratch_folder

STORE_SUFFIXES = (".duckdb", ".duckdb.wal")
# Compressed logs are read as the text they hold; the suffix names the codec.
COMPRESSED_SUFFIXES = (".gz", ".bz2", ".xz", ".zst")
ZSTD_HINT = "reading .zst logs needs the zstandard package: pip install 'polytrace[zstd]'"


class UnreadableFile(Exception):
    """The file cannot be read at all (permissions, I/O error, a missing decompressor)."""


class CorruptFile(Exception):
    """A compressed file whose archive is damaged (truncated, bad header, bad checksum)."""


def path_text(path: str | os.PathLike) -> str:
    """The path as valid UTF-8 text: bytes of a name that is not UTF-8 are written as \\xNN."""
    text = os.fspath(path)
    if isinstance(text, str) and text.isascii():
        return text  # the same text, without encoding it (a batch of 5,000 files asked 35,000 times)
    return os.fsencode(path).decode("utf-8", "backslashreplace")


# Files whose names only logs carry: when their first block does not sniff, later blocks are sniffed
# too (a job's start-up output can fill the first block), and one that is not read at all makes the
# ingest fail instead of being skipped quietly.
LOG_SUFFIXES = (".log", ".out", ".jsonl")


def is_log_like(path: str | os.PathLike) -> bool:
    """True for a file whose name says it is a log (`LOG_SUFFIXES`, before any compression suffix)."""
    name = Path(path).name.lower()
    for suffix in COMPRESSED_SUFFIXES:
        name = name.removesuffix(suffix)
    return name.endswith(LOG_SUFFIXES)


# Files a training writer leaves beside the records polytrace reads: when no format reads one met
# in a folder, it is ignored under its rule (counted and listed by `ingest --verbose`), never a
# "log that was not read". (rule, regex over the path's parts joined by '/', searched from its start).
CHECKPOINT_FILE = "checkpoint file"
_WANDB_RUN = r"(?:.*/)?(?:wandb|latest-run|(?:offline-)?run-\d{8}_\d{6}-[^/]+)/(?:.*/)?"
SIDE_FILE_RULES: tuple[tuple[str, str], ...] = (
    ("wandb debug log", _WANDB_RUN + r"(?:debug(?:-internal|-core|-cli\.[^/]*)?|core-debug-[^/]*)\.log$"),
    ("wandb run file", _WANDB_RUN + r"(?:wandb-metadata\.json|requirements\.txt|conda-environment\.yaml|"
                       r"diff\.patch|[^/]*\.patch|media/.*|tmp/.*|code/.*)$"),
    ("mlflow side file", r"(?:.*/)?mlruns/(?:.*/)?(?:artifacts/.*|inputs/.*|outputs/.*|meta\.yaml)$"),
    ("tensorboard side file", r"(?:.*/)?(?:plugins/profile/.*|projector_config\.pbtxt|[^/]*\.profile-empty)$"),
    (CHECKPOINT_FILE, r"(?:.*/)?(?:checkpoint-\d+|global_step_?\d+|step_\d+|checkpoints?)/.*$"),
)
_SIDE_FILES = [(rule, re.compile(pattern)) for rule, pattern in SIDE_FILE_RULES]


def side_file_rule(path: str | os.PathLike) -> str | None:
    """The `SIDE_FILE_RULES` rule a file's path falls under, else None. A file named as a log
    (`is_log_like`) in a checkpoint folder is no side file: a log no format reads is reported."""
    text = "/".join(Path(path).parts)
    for rule, pattern in _SIDE_FILES:
        if pattern.match(text):
            return None if rule == CHECKPOINT_FILE and is_log_like(path) else rule
    return None


def is_compressed(path: Path) -> bool:
    """True when the file name ends in a compression suffix (.gz, .bz2, .xz, .zst)."""
    return path.suffix.lower() in COMPRESSED_SUFFIXES


def _open_decompressed(path: Path):
    suffix = path.suffix.lower()
    if suffix == ".gz":
        import gzip

        return gzip.open(path, "rb")
    if suffix == ".bz2":
        import bz2

        return bz2.open(path, "rb")
    import lzma

    return lzma.open(path, "rb")


# The most text a compressed input may expand to, and the most times its own size: past either the
# file is refused with one line (a decompression bomb: 131 KB of zstd can hold 4 GB of text).
EXPANDED_MAX_BYTES = 16 << 30
EXPANSION_MAX_RATIO = 2000
# Inputs this small may expand to this much whatever their ratio.
EXPANSION_FREE_BYTES = 64 << 20


def _expansion_cap(source: Path) -> int:
    """The most bytes `source`'s text may hold (EXPANDED_MAX_BYTES, EXPANSION_MAX_RATIO)."""
    try:
        size = source.stat().st_size
    except OSError:
        size = 0
    return min(EXPANDED_MAX_BYTES, max(EXPANSION_FREE_BYTES, size * EXPANSION_MAX_RATIO))


def _copy_capped(read, out, source: Path, chunk_size: int = 8 << 20) -> None:
    """Copy the decompressed text `read(n)` gives into `out`, a chunk at a time (memory holds one
    chunk), refusing it once it passes `_expansion_cap(source)`."""
    cap = _expansion_cap(source)
    written = 0
    while chunk := read(chunk_size):
        written += len(chunk)
        if written > cap:
            raise UnreadableFile(f"its text expands past {cap:,} bytes ({source.stat().st_size:,} compressed),"
                                 " the most a compressed input may hold: a decompression bomb, or decompress it"
                                 " yourself")
        out.write(chunk)


_ZSTD_MAGIC = 0xFD2FB528
_SKIPPABLE_MAGIC = range(0x184D2A50, 0x184D2A60)


def zstd_frames_problem(path: Path) -> str | None:
    """Why the .zst file is not a whole sequence of frames (a frame cut short, bytes that are no
    frame), or None. Walks the frame and block headers only (RFC 8878): nothing is decompressed."""
    import struct

    with open(path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        offset = 0
        while offset < size:
            handle.seek(offset)
            magic_bytes = handle.read(4)
            if len(magic_bytes) < 4:
                return "the last frame is cut short"
            (magic,) = struct.unpack("<I", magic_bytes)
            if magic in _SKIPPABLE_MAGIC:
                length = handle.read(4)
                if len(length) < 4:
                    return "the last frame is cut short"
                offset += 8 + struct.unpack("<I", length)[0]
                continue
            if magic != _ZSTD_MAGIC:
                return f"byte {offset} does not start a zstd frame"
            descriptor = handle.read(1)
            if not descriptor:
                return "the last frame is cut short"
            flags = descriptor[0]
            single_segment = flags >> 5 & 1
            header = (0 if single_segment else 1) + (0, 1, 2, 4)[flags & 3] \
                + ((1 if single_segment else 0), 2, 4, 8)[flags >> 6]
            offset += 5 + header
            while True:
                handle.seek(offset)
                block = handle.read(3)
                if len(block) < 3:
                    return "the last frame is cut short"
                value = int.from_bytes(block, "little")
                last, kind, length = value & 1, value >> 1 & 3, value >> 3
                if kind == 3:
                    return f"byte {offset} holds a reserved block type"
                offset += 3 + (1 if kind == 1 else length)
                if last:
                    break
            offset += 4 if flags >> 2 & 1 else 0
        if offset > size:
            return "the last frame is cut short"
    return None


def _unzstd(source: Path, out, chunk_size: int = 8 << 20) -> None:
    """Decompress every frame of a .zst file into `out`, streamed (memory holds one chunk of text);
    a file that is not a whole sequence of frames is corrupt (checked first, on the headers)."""
    try:
        import zstandard
    except ImportError:
        raise UnreadableFile(ZSTD_HINT) from None
    problem = zstd_frames_problem(source)
    if problem:
        raise CorruptFile(f"damaged {source.suffix} archive: {problem}")
    with open(source, "rb") as handle:
        reader = zstandard.ZstdDecompressor().stream_reader(handle, read_across_frames=True)
        _copy_capped(reader.read, out, source, chunk_size)


@dataclass(frozen=True)
class Readable:
    """What an ingester reads for one input file: `path` is a plain, UTF-8-named file holding the
    input's text (the input itself, or a copy or link in the store's scratch folder); `name_path` is
    the name sniffers see (the input's name without its compression suffix). `compressed`: the text was decompressed;
    `rewritten`: the text differs from the input's bytes (decompressed, or its line ends or byte
    order mark rewritten, see `needs_text_rewrite`), so its lines are counted on `path`."""

    path: Path
    name_path: Path
    compressed: bool
    rewritten: bool = False


BOM = b"\xef\xbb\xbf"


def needs_text_rewrite(head: bytes) -> bool:
    """True when a file's text, whose first bytes are `head`, is read from a rewritten copy: it
    starts with a UTF-8 byte order mark (not part of its first line), or its lines end in CR alone
    (a CR and no LF in the first bytes)."""
    return head.startswith(BOM) or (b"\r" in head and b"\n" not in head)


def _rewrite_text(source: Path, target: Path, chunk_size: int = 8 << 20) -> None:
    """Copy `source` to `target` without a leading byte order mark, with CR-only line ends as LF
    when the first bytes hold CR and no LF."""
    with open(source, "rb") as handle, open(target, "wb") as out:
        chunk = handle.read(chunk_size)
        cr_only = b"\r" in chunk[:65536] and b"\n" not in chunk[:65536]
        chunk = chunk.removeprefix(BOM)
        while chunk:
            out.write(chunk.replace(b"\r", b"\n") if cr_only else chunk)
            chunk = handle.read(chunk_size)


@contextmanager
def readable(source: Path, store: str | os.PathLike | None = None) -> Iterator[Readable]:
    """A plain file with the text of `source`, removed afterwards.

    A compressed file is decompressed once into a folder of `scratch_folder(store)` (beside the
    store file `store`), named like its parent folder
    (ingesters may read the folder name); a text that starts with a byte order mark or whose lines
    end in CR alone is rewritten there (`needs_text_rewrite`); a file whose name is not UTF-8 is
    linked there under a UTF-8 name, since DuckDB opens files by UTF-8 names. Raises
    UnreadableFile or CorruptFile.
    """
    compressed = is_compressed(source)
    inner_name = path_text(source.name[: -len(source.suffix)] if compressed else source.name)
    utf8_name = path_text(source) == os.fsdecode(source)
    rewrite = not compressed and _head_needs_rewrite(source)
    if not compressed and utf8_name and not rewrite:
        yield Readable(source, source, False)
        return
    with scratch_folder(store, "read") as folder:
        parent = folder / (path_text(source.resolve().parent.name) or "input")
        parent.mkdir()
        target = parent / inner_name
        if compressed:
            _decompress(source, target)
            if _head_needs_rewrite(target):
                rewritten = parent / (inner_name + ".text")
                _rewrite_text(target, rewritten)
                os.replace(rewritten, target)
        elif rewrite:
            try:
                _rewrite_text(source, target)
            except OSError as error:
                raise UnreadableFile(error.strerror or str(error)) from None
        else:
            target.symlink_to(source.resolve())
        # Sniffers see the input's own location (a format may look at the files beside it).
        name_path = source.with_name(inner_name) if compressed else (source if rewrite else target)
        yield Readable(target, name_path, compressed, rewritten=compressed or rewrite)


def _head_needs_rewrite(path: Path) -> bool:
    try:
        with open(path, "rb") as handle:
            return needs_text_rewrite(handle.read(65536))
    except OSError:
        return False  # the reader meets the same error and reports it


def _decompress(source: Path, target: Path) -> None:
    try:
        handle = open(source, "rb")
    except OSError as error:
        raise UnreadableFile(error.strerror or str(error)) from None
    handle.close()
    try:
        with open(target, "wb") as out:
            if source.suffix.lower() == ".zst":
                _unzstd(source, out)
            else:
                with _open_decompressed(source) as stream:
                    _copy_capped(stream.read, out, source)
    except (UnreadableFile, CorruptFile):
        raise
    except OSError as error:
        if error.errno is not None and not isinstance(error, EOFError):
            raise UnreadableFile(error.strerror or str(error)) from None
        raise CorruptFile(f"damaged {source.suffix} archive: {error}") from None
    except Exception as error:  # EOFError, zlib.error, lzma.LZMAError, zstandard.ZstdError
        raise CorruptFile(f"damaged {source.suffix} archive: {error}") from None


def hash_and_count_bytes(data: bytes) -> tuple[str, int, int]:
    """`hash_and_count` of a file's bytes already read."""
    lines = data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)
    return hashlib.sha256(data).hexdigest(), len(data), lines


def hash_and_count(path: Path, chunk_size: int = 8 << 20) -> tuple[str, int, int]:
    """sha256, size in bytes and number of lines (a last line without newline counts)."""
    return hash_range(path, chunk_size=chunk_size).counted


@dataclass(frozen=True)
class RangeHashes:
    """`hash_range` of a file: the sha256 of the bytes read (the file up to `limit`), their size,
    lines (a last line without newline counts) and `complete`, the bytes up to and including the
    last newline among them (0 when the newline is not among the bytes read)."""

    sha: str
    size: int
    lines: int
    complete: int

    @property
    def counted(self) -> tuple[str, int, int]:
        """(sha256, size, lines), as `hash_and_count` gives them."""
        return self.sha, self.size, self.lines


# Per file hashed in this process, keyed by (path, bytes hashed, sha256 hex of them), the most recent
# last: the hash object at its end (taken up by a later hash of the grown file in this process) and
# its `sha_state` state after the last whole block (kept with a log's record: `state_kept_for`).
_HASHED: OrderedDict[tuple[Path, int, str], tuple[object, dict | None]] = OrderedDict()
_HASHED_KEPT = 256


def _new_hash(state: dict | None = None):
    return sha_state.Sha256(state) if sha_state.available() else hashlib.sha256()


def _resumed(state: dict | None, prefix: int):
    """A hash going on from `state` when it is a state of at most `prefix` bytes, else None."""
    if state is None or not sha_state.available():
        return None
    try:
        return sha_state.Sha256(state) if state["bytes"] <= prefix else None
    except (KeyError, TypeError, ValueError):  # not a state this code wrote: the file is hashed whole
        return None


def hash_range(path: Path, limit: int | None = None, state: dict | None = None, prefix: int = 0,
               prefix_lines: int = 0, prefix_sha: str | None = None, chunk_size: int = 8 << 20) -> RangeHashes:
    """One pass over the first `limit` bytes of `path` (all when None): their sha256, size, lines and
    last newline.

    For a file that grew: its first `prefix` bytes, holding `prefix_lines` newlines, are not counted
    again, and they are taken as hashed when they were before: the hash goes on from `state` (a
    `sha_state` state the store kept for the file, covering at most `prefix` bytes), or from the hash
    this process ended at `prefix` bytes, when it has one whose sha256 is `prefix_sha`; otherwise
    the file is hashed from its start."""
    digest, size, newlines = None, 0, 0
    if prefix:
        newlines = prefix_lines
        hashed = _HASHED.get((path, prefix, prefix_sha)) if prefix_sha else None
        resumed = _resumed(state, prefix)
        if resumed is not None:
            digest, size = resumed, resumed.size
        elif hashed is not None:
            digest, size = hashed[0].copy(), prefix
    if digest is None:
        digest = _new_hash()
    complete = 0
    last = b""
    kept = None
    with open(path, "rb") as handle:
        handle.seek(size)
        while limit is None or size < limit:
            want = chunk_size if limit is None else min(chunk_size, limit - size)
            chunk = handle.read(want)
            if not chunk:
                break
            whole_blocks = len(chunk) - (size + len(chunk)) % sha_state.BLOCK
            if isinstance(digest, sha_state.Sha256) and 0 <= whole_blocks < len(chunk):
                # The state after the last whole block, before the bytes that end the file (or this read).
                digest.update(chunk[:whole_blocks])
                kept = digest.state()
                digest.update(chunk[whole_blocks:])
            else:
                digest.update(chunk)
            if size + len(chunk) > prefix:
                newlines += chunk.count(b"\n", max(0, prefix - size))
            cut = chunk.rfind(b"\n")
            if cut >= 0:
                complete = size + cut + 1
            size += len(chunk)
            last = chunk[-1:]
    if isinstance(digest, sha_state.Sha256) and not size % sha_state.BLOCK:
        kept = digest.state()
    lines = newlines + (1 if size and last != b"\n" else 0)
    sha = digest.hexdigest()
    _HASHED[(path, size, sha)] = (digest, kept)  # nothing updates it again: later hashes take copies
    while len(_HASHED) > _HASHED_KEPT:
        _HASHED.popitem(last=False)
    return RangeHashes(sha, size, lines, complete)


def state_kept_for(path: Path, size: int, sha: str) -> dict | None:
    """The `sha_state` state after the last whole block of the file `path` hashed in this process to
    `size` bytes of sha256 `sha` (None when it was not, or states cannot be kept)."""
    hashed = _HASHED.get((path, size, sha))
    return hashed[1] if hashed else None


# The block before an appended read's start whose sha256 says the file only grew since it was read.
GROWTH_BLOCK_BYTES = 1 << 16


def block_sha(path: Path, end: int) -> str | None:
    """sha256 of the GROWTH_BLOCK_BYTES bytes of `path` before byte `end` (fewer at the file's
    start), or None when the file holds fewer than `end` bytes."""
    start = max(0, end - GROWTH_BLOCK_BYTES)
    with open(path, "rb") as handle:
        handle.seek(start)
        data = handle.read(end - start)
    return hashlib.sha256(data).hexdigest() if len(data) == end - start else None


def last_newline_end(path: Path, size: int, window: int = 1 << 16) -> int:
    """The bytes of `path` up to and including its last newline before `size` (0 when it has none)."""
    with open(path, "rb") as handle:
        end = size
        while end > 0:
            start = max(0, end - window)
            handle.seek(start)
            cut = handle.read(end - start).rfind(b"\n")
            if cut >= 0:
                return start + cut + 1
            end = start
    return 0


@contextmanager
def byte_range_copy(path: Path, start: int, end: int, store: str | os.PathLike | None = None) -> Iterator[Path]:
    """A file holding bytes start..end of `path` (the lines appended to a log, or its complete lines),
    in a folder of `scratch_folder(store)`, removed afterwards. Named like `path`, in a folder named
    like its parent, as sniffers see it."""
    with scratch_folder(store, "part") as folder:
        parent = folder / (path_text(path.resolve().parent.name) or "input")
        parent.mkdir()
        target = parent / path_text(path.name)
        with open(path, "rb") as source, open(target, "wb") as out:
            source.seek(start)
            remaining = end - start
            while remaining > 0:
                chunk = source.read(min(remaining, 8 << 20))
                if not chunk:
                    break
                out.write(chunk)
                remaining -= len(chunk)
        yield target


class Skip(str):
    """The reason a file met while walking a folder is not read, by a named rule (not an error)."""


LINK_OUTSIDE = "a link to a file outside the folder given: not read"
LISTED_TWICE = "the same file as one listed before it (reached through a link): read once"
NOT_A_FAILURE = (LINK_OUTSIDE, LISTED_TWICE)


def walk(paths: Iterable[str | Path]) -> Iterator[tuple[Path, bool, str | None]]:
    """(file, named_explicitly, problem) for every file under the given paths, sorted.

    A file met in a folder is given as its resolved path (the folder is resolved once; only a
    file reached through a symbolic link is resolved on its own). Hidden folders below a given
    folder, hidden files whose name does not say they are logs (`is_log_like`: `.docker_run.log` is
    read, `.DS_Store` is not), folders reached through a symbolic link, DuckDB store files and a
    store's scratch folder (`scratch_root`) are left out. A folder below that cannot be listed is given as a path with its problem: what it holds was not read.
    A file reached through a link that resolves outside the given folder is given with the `Skip`
    LINK_OUTSIDE (it is never opened), and a file met a second time through a link with LISTED_TWICE.
    """
    seen: set[Path] = set()
    for given in paths:
        path = Path(given)
        if not path.exists():
            yield path, True, "no such file or directory"
        elif path.is_dir():
            root = path.resolve()
            for relative, linked, problem in sorted(_files_below(root, ())):
                child = root.joinpath(*relative)
                if linked and not problem:
                    try:
                        child = child.resolve(strict=True)
                    except (OSError, RuntimeError) as error:  # a dangling link, a loop of links
                        yield child, False, f"cannot read: {getattr(error, 'strerror', None) or error}"
                        continue
                    if not child.is_relative_to(root):
                        yield root.joinpath(*relative), False, Skip(LINK_OUTSIDE)
                        continue
                if child in seen and not problem:
                    yield child, False, Skip(LISTED_TWICE)
                    continue
                seen.add(child)
                yield child, False, problem
        elif path.is_file():
            seen.add(path.resolve())
            yield path, True, None
        else:
            yield path, True, "not a regular file"


def _files_below(folder: Path, parts: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], bool, str | None]]:
    """(relative parts, reached through a link, problem) of every regular file below `folder` (not
    hidden, not a store file), by one `scandir` per folder: no file is stat'ed unless it is a link.
    A folder that cannot be listed is itself given, with the reason as its problem."""
    try:
        entries = list(os.scandir(folder.joinpath(*parts)))
    except OSError as error:
        yield parts, False, f"cannot read folder: {error.strerror or error}"
        return
    for entry in entries:
        name = entry.name
        try:
            if name.startswith(".") and (entry.is_dir(follow_symlinks=False) or not is_log_like(name)):
                continue
            if entry.is_dir(follow_symlinks=False):
                if name.endswith(SCRATCH_SUFFIX) and os.path.isfile(entry.path[: -len(SCRATCH_SUFFIX)]):
                    continue  # a store's scratch folder (`scratch_root`): copies of inputs, never inputs
                yield from _files_below(folder, (*parts, name))
            elif entry.is_file() and not name.endswith(STORE_SUFFIXES):
                yield (*parts, name), entry.is_symlink(), None
        except OSError as error:
            yield (*parts, name), False, f"cannot read: {error.strerror or error}"


class FileHashes:
    """`hash_and_count` of files, computed one at a time in a background thread.

    `prefetch` queues files before they are needed; `future` returns a file's pending or finished
    result, queueing it if it was not. Results are keyed by resolved path.
    """

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="polytrace-hash")
        self._jobs: dict[Path, Future] = {}

    def future(self, path: Path) -> Future:
        """The (maybe still running) `hash_and_count` of `path`."""
        if path in self._jobs:  # already a resolved path: no need to resolve it again
            return self._jobs[path]
        key = Path(path).resolve()
        if key not in self._jobs:
            self._jobs[key] = self._pool.submit(hash_and_count, key)
        return self._jobs[key]

    def of_resolved(self, resolved: Path) -> None:
        """Queue the `hash_and_count` of a file by its path already resolved (read in the thread)."""
        if resolved not in self._jobs:
            self._jobs[resolved] = self._pool.submit(hash_and_count, resolved)

    def of_bytes(self, resolved: Path, data: bytes) -> None:
        """Queue the `hash_and_count` of a file (by its resolved path) from its bytes already read."""
        if resolved not in self._jobs:
            self._jobs[resolved] = self._pool.submit(hash_and_count_bytes, data)

    def known(self, resolved: Path, result: tuple[str, int, int]) -> None:
        """Record the `hash_and_count` of a file (by its resolved path) computed elsewhere."""
        if resolved not in self._jobs:
            done: Future = Future()
            done.set_result(result)
            self._jobs[resolved] = done

    def result(self, path: Path) -> tuple[str, int, int]:
        """`hash_and_count(path)`, waiting for it if needed."""
        return self.future(path).result()

    def prefetch(self, paths: Iterable[Path]) -> None:
        """Queue every given file."""
        for path in paths:
            self.future(path)

    def close(self) -> None:
        """Drop queued work that has not started; a running hash finishes in the background."""
        self._pool.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> FileHashes:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
