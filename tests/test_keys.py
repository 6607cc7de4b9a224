"""job_lock_key: FNV-1a 64 over UTF-8, reinterpreted as int64 exactly as Go does."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cronlock._keys import job_lock_key, ledger_keys, ledger_lock_key


def _as_int64(unsigned: int) -> int:
    """Go's int64(u): the same 64 bits read as two's complement."""
    signed: int = struct.unpack("<q", struct.pack("<Q", unsigned))[0]
    return signed


def _fnv1a64_reference(data: bytes) -> int:
    """A second, deliberately plain transcription of the FNV-1a 64 reference algorithm."""
    h = 14695981039346656037  # offset basis
    for octet in data:
        h ^= octet
        h = (h * 1099511628211) % 2**64  # FNV prime
    return h


# Published FNV-1a 64 results (unsigned), from the FNV reference test vectors.
@pytest.mark.parametrize(
    ("name", "unsigned"),
    [
        ("", 0xCBF29CE484222325),
        ("a", 0xAF63DC4C8601EC8C),
        ("b", 0xAF63DF4C8601F1A5),
        ("c", 0xAF63DE4C8601EFF2),
        ("foo", 0xDCB27518FED9D577),
        ("foobar", 0x85944171F73967E8),
    ],
)
def test_known_fnv1a_64_vectors(name: str, unsigned: int) -> None:
    assert job_lock_key(name) == _as_int64(unsigned)


def test_empty_name_is_the_offset_basis_as_int64() -> None:
    assert job_lock_key("") == -3750763034362895579


def test_high_bit_set_gives_a_negative_key_like_go() -> None:
    # 0xaf63... has its top bit set, so Go's int64() makes it negative.
    assert job_lock_key("a") == 0xAF63DC4C8601EC8C - 2**64
    assert job_lock_key("a") < 0


def test_names_are_hashed_as_utf8() -> None:
    assert job_lock_key("nächtlich") == _as_int64(_fnv1a64_reference("nächtlich".encode()))
    assert job_lock_key("é") != job_lock_key("e\u0301")  # no normalisation, like Go


def test_stable_and_distinct_for_typical_names() -> None:
    assert job_lock_key("nightly-reindex") == job_lock_key("nightly-reindex")
    names = [f"job-{i}" for i in range(10_000)]
    assert len({job_lock_key(n) for n in names}) == len(names)


@given(st.text())
def test_matches_reference_and_fits_bigint(name: str) -> None:
    key = job_lock_key(name)
    assert -(2**63) <= key < 2**63
    assert key == _as_int64(_fnv1a64_reference(name.encode("utf-8")))


@given(st.text(), st.lists(st.text(), min_size=1, max_size=5))
def test_a_ledgers_keys_hashed_from_its_prefix_are_its_keys(ledger: str, names: list[str]) -> None:
    # A locker hashes its ledger's part once and each job's name after it (FNV-1a reads
    # its input in order): the same keys as ledger_lock_key, which FleetControl and the
    # collision checks compute.
    keys = ledger_keys(ledger)
    assert [keys(name) for name in names] == [ledger_lock_key(ledger, name) for name in names]
