"""A sha256 state written down after a whole number of blocks and taken up again gives hashlib's digest."""

from __future__ import annotations

import hashlib
import json
import random

import pytest

from polytrace_cli.ingest import files, sha_state

needs_states = pytest.mark.skipif(not sha_state.available(), reason="libcrypto's SHA-256 cannot be loaded here")


@needs_states
def test_a_state_taken_up_again_hashes_as_one_pass():
    rng = random.Random(5)
    for _ in range(200):
        data = rng.randbytes(rng.randrange(0, 3000))
        blocks = rng.randrange(0, len(data) // 64 + 1)
        first = sha_state.Sha256()
        first.update(data[:blocks * 64])
        state = json.loads(json.dumps(first.state()))  # as the store keeps it
        assert state["bytes"] == blocks * 64
        resumed = sha_state.Sha256(state)
        resumed.update(data[blocks * 64:])
        assert resumed.hexdigest() == hashlib.sha256(data).hexdigest()
        assert first.hexdigest() == hashlib.sha256(data[:blocks * 64]).hexdigest()  # a digest ends nothing


@needs_states
def test_only_a_whole_number_of_blocks_has_a_state():
    digest = sha_state.Sha256()
    digest.update(b"x" * 100)
    assert digest.state() is None
    digest.update(b"x" * 28)
    assert digest.state()["bytes"] == 128
    with pytest.raises(ValueError):
        sha_state.Sha256({"bytes": 100, "words": "00" * 32})


@needs_states
def test_a_file_hashed_from_its_kept_state_reads_only_its_growth(tmp_path):
    path = tmp_path / "a.log"
    rng = random.Random(8)
    for _ in range(50):
        before = b"".join(b"line %d\n" % rng.randrange(10**6) for _ in range(rng.randrange(1, 400)))
        after = b"".join(b"more %d\n" % rng.randrange(10**6) for _ in range(rng.randrange(1, 100)))
        path.write_bytes(before)
        first = files.hash_range(path, chunk_size=rng.choice([64, 100, 8 << 20]))
        state = files.state_kept_for(path, first.size, first.sha)
        assert state["bytes"] == len(before) - len(before) % 64
        files._HASHED.clear()
        # Bytes the state covers are not read again: changed ones leave the digest of the first read.
        path.write_bytes(b"#" * state["bytes"] + before[state["bytes"]:] + after)
        grown = files.hash_range(path, state=state, prefix=len(before), prefix_lines=before.count(b"\n"))
        assert grown.counted == (hashlib.sha256(before + after).hexdigest(), len(before + after),
                                 (before + after).count(b"\n"))


def test_without_states_a_grown_file_is_hashed_whole(tmp_path, monkeypatch):
    path = tmp_path / "a.log"
    path.write_bytes(b"a\n" * 100)
    kept = {"bytes": 128, "words": "00" * 32}
    monkeypatch.setattr(sha_state, "available", lambda: False)
    path.write_bytes(b"a\n" * 150)
    grown = files.hash_range(path, state=kept, prefix=200, prefix_lines=100)
    assert grown.counted == (hashlib.sha256(b"a\n" * 150).hexdigest(), 300, 150)
    assert files.state_kept_for(path, 300, grown.sha) is None


@needs_states
def test_a_damaged_state_is_not_taken_up(tmp_path):
    path = tmp_path / "a.log"
    path.write_bytes(b"a\n" * 150)
    for state in ({"bytes": 128}, {"bytes": 128, "words": "zz"}, {"bytes": "x", "words": "00" * 32},
                  {"bytes": 64, "words": "00" * 31}):
        grown = files.hash_range(path, state=state, prefix=200, prefix_lines=100)
        assert grown.counted == (hashlib.sha256(b"a\n" * 150).hexdigest(), 300, 150)
