"""SHA-256 whose state can be written down and taken up again by another process.

A log that grows is hashed whole once. Its hash state after the last whole 64-byte block is kept
with the file's record (`files.resume_state`, key `sha_state`), and the next read of the grown log
hashes only the bytes after that block: the sha256 of the whole file costs the growth, not the
file. hashlib's hash objects cannot be written down, so the state is OpenSSL's own (`SHA256_CTX`:
the eight 32-bit chaining words and the count of bits hashed), reached through ctypes in the
libcrypto that Python's hashlib is built on. Where that library cannot be loaded, or fails the
known-answer check on loading, `available()` is False: no state is kept and a grown file is
hashed whole, as before.

A state is a JSON object {"bytes": N, "words": 64 hex digits}, N a multiple of 64.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import sys

BLOCK = 64
# The libcrypto sonames whose SHA256_CTX has the layout below (OpenSSL 1.1 and 3).
_LIBRARIES = ("libcrypto.so.3", "libcrypto.so.1.1")


class _Context(ctypes.Structure):
    # OpenSSL's SHA256_CTX (openssl/sha.h): h[8], Nl, Nh, data[16], num, md_len.
    _fields_ = [("h", ctypes.c_uint32 * 8), ("Nl", ctypes.c_uint32), ("Nh", ctypes.c_uint32),
                ("data", ctypes.c_uint32 * 16), ("num", ctypes.c_uint), ("md_len", ctypes.c_uint)]


@functools.cache
def _library():
    """libcrypto's SHA-256 functions, or None where they cannot be used (see the module)."""
    if not sys.platform.startswith("linux"):
        return None  # other systems' unversioned libcrypto may refuse to be loaded this way
    for name in _LIBRARIES:
        try:
            library = ctypes.CDLL(name)
            functions = library.SHA256_Init, library.SHA256_Update, library.SHA256_Final
        except (OSError, AttributeError):
            continue
        init, update, final = functions
        init.argtypes = [ctypes.POINTER(_Context)]
        update.argtypes = [ctypes.POINTER(_Context), ctypes.c_void_p, ctypes.c_size_t]
        final.argtypes = [ctypes.c_char_p, ctypes.POINTER(_Context)]
        if _known_answers(init, update, final):
            return init, update, final
    return None


def _known_answers(init, update, final) -> bool:
    """The functions hash as hashlib does, also from a state written down and taken up again."""
    data = bytes(range(256)) * 5 + b"tail"
    try:
        whole = Sha256(functions=(init, update, final))
        whole.update(data[:640])
        state = whole.state()
        whole.update(data[640:])
        resumed = Sha256(state, functions=(init, update, final))
        resumed.update(data[640:])
        expected = hashlib.sha256(data).hexdigest()
        return state is not None and whole.hexdigest() == expected == resumed.hexdigest()
    except Exception:
        return False


def available() -> bool:
    """Whether states can be kept and taken up (libcrypto loaded and checked)."""
    return _library() is not None


class Sha256:
    """An incremental SHA-256 (`update`, `hexdigest`) that starts from `state` (None: from nothing)
    and tells its own state after a whole number of blocks (`state`). Requires `available()`."""

    def __init__(self, state: dict | None = None, functions=None):
        self._init, self._update, self._final = functions or _library()
        self._context = _Context()
        self._init(ctypes.byref(self._context))
        self.size = 0
        if state is not None:
            size, words = int(state["bytes"]), bytes.fromhex(state["words"])
            if size % BLOCK or len(words) != 32:
                raise ValueError("not a SHA-256 state at a block boundary")
            for index in range(8):
                self._context.h[index] = int.from_bytes(words[4 * index:4 * index + 4], "big")
            bits = size * 8
            self._context.Nl, self._context.Nh = bits & 0xFFFFFFFF, (bits >> 32) & 0xFFFFFFFF
            self.size = size

    def update(self, data: bytes) -> None:
        self._update(ctypes.byref(self._context), data, len(data))
        self.size += len(data)

    def copy(self) -> Sha256:
        """An independent hash at the same point."""
        other = Sha256.__new__(Sha256)
        other._init, other._update, other._final = self._init, self._update, self._final
        other._context = _Context.from_buffer_copy(self._context)
        other.size = self.size
        return other

    def hexdigest(self) -> str:
        """The sha256 of the bytes hashed so far (the hash goes on unchanged)."""
        copy = _Context.from_buffer_copy(self._context)
        out = ctypes.create_string_buffer(32)
        self._final(out, ctypes.byref(copy))
        return out.raw.hex()

    def state(self) -> dict | None:
        """The state after the bytes hashed so far, when they are a whole number of blocks, else None."""
        if self.size % BLOCK or self._context.num:
            return None
        words = b"".join(int(word).to_bytes(4, "big") for word in self._context.h)
        return {"bytes": self.size, "words": words.hex()}
