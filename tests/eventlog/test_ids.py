"""Ids are NATS subject tokens: the validation table, and the properties of generated ids."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentlog.eventlog import ids
from agentlog.eventlog.errors import InvalidId
from agentlog.eventlog.ids import THREAD_LEVEL_RUN, is_valid_id, new_id, validate_id, validate_run_id

VALID = ["a", "Z", "0", "_", "-", "thread-1", "run_2", "A-z_09", "x" * 128, "0191b3c4d5e6f7a8b9c0d1e2f3a4b5c6"]
INVALID = [
    "",
    "x" * 129,
    "a.b",
    ".",
    "*",
    ">",
    "a*",
    "a>",
    "has space",
    " lead",
    "trail ",
    "tab\t",
    "new\nline",
    "cr\r",
    "é",
    "ünïcode",
    "emoji🙂",
    "slash/",
    "back\\slash",
    "colon:",
    "nul\x00",
    None,
    42,
    b"bytes",
    ["a"],
]


@pytest.mark.parametrize("value", VALID)
def test_valid_ids(value: str) -> None:
    assert is_valid_id(value)
    assert validate_id(value, "thread_id") == value


@pytest.mark.parametrize("value", INVALID)
def test_invalid_ids_raise_a_clear_error(value: object) -> None:
    assert not is_valid_id(value)
    with pytest.raises(InvalidId) as info:
        validate_id(value, "thread_id")
    assert isinstance(info.value, ValueError)
    assert info.value.kind == "thread_id"
    assert "invalid thread_id" in str(info.value)
    assert "A-Z, a-z, 0-9" in str(info.value)


def test_error_message_stays_short_for_huge_values() -> None:
    with pytest.raises(InvalidId) as info:
        validate_id("x" * 10_000, "run_id")
    assert len(str(info.value)) < 250


def test_thread_level_token_is_reserved_for_runs() -> None:
    assert validate_id(THREAD_LEVEL_RUN) == THREAD_LEVEL_RUN
    with pytest.raises(InvalidId):
        validate_run_id(THREAD_LEVEL_RUN)
    assert validate_run_id("r1") == "r1"
    with pytest.raises(InvalidId):
        validate_run_id("r.1")


@given(st.text(max_size=140))
def test_validity_matches_the_token_grammar(value: str) -> None:
    assert is_valid_id(value) == (re.fullmatch(r"[A-Za-z0-9_-]{1,128}", value, re.ASCII) is not None)


def test_new_id_is_a_uuid7_hex_token() -> None:
    value = new_id()
    assert re.fullmatch(r"[0-9a-f]{32}", value)
    assert is_valid_id(value)
    assert value[12] == "7"  # version nibble
    assert int(value[16], 16) >> 2 == 0b10  # RFC 4122 variant


def test_new_ids_are_unique() -> None:
    assert len({new_id() for _ in range(20_000)}) == 20_000


def test_new_id_carries_its_millisecond() -> None:
    before = ids.now_ms()
    value = new_id()
    after = ids.now_ms()
    assert before <= int(value[:12], 16) <= after


@given(st.integers(min_value=0, max_value=2**48 - 2), st.integers(min_value=1, max_value=10_000))
def test_new_ids_are_time_ordered_across_milliseconds(ms: int, step: int) -> None:
    later_ms = min(ms + step, 2**48 - 1)
    clock = iter([ms, later_ms])
    original = ids.now_ms
    ids.now_ms = lambda: next(clock)  # type: ignore[assignment]
    try:
        first, second = new_id(), new_id()
    finally:
        ids.now_ms = original  # type: ignore[assignment]
    assert first < second
    assert int(first[:12], 16) == ms and int(second[:12], 16) == later_ms


def test_real_clock_ids_are_ordered_once_the_millisecond_ticks() -> None:
    first = new_id()
    start = ids.now_ms()
    while ids.now_ms() == start:  # wait for the clock to tick, not for a fixed time
        pass
    assert new_id() > first
