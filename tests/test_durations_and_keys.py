"""Durations (util.durations), keys (util.keys) and prefix scans
(stores.model.prefix_upper_bound)."""

from __future__ import annotations

import math
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tasklock_cli.errors import UsageError
from tasklock_cli.util.durations import _finite_seconds
from tasklock_cli.util.durations import format_duration
from tasklock_cli.util.durations import parse_duration
from tasklock_cli.util.keys import validate_key


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("500ms", 0.5),
        ("30s", 30),
        ("5m", 300),
        ("1h30m", 5400),
        ("2d", 172800),
        ("12", 12),
        ("1.5", 1.5),
        ("1h0m5s", 3605),
        ("inf", math.inf),
        (" 10s ", 10),
    ],
)
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    "text", ["", "s", "-1s", "1x", "5s1h", "1m1m", "1 h", "1e3", "nan", "1h 30m", "10sec", "∞"]
)
def test_bad_durations(text):
    with pytest.raises(UsageError):
        parse_duration(text)


def test_inf_can_be_refused():
    with pytest.raises(UsageError):
        parse_duration("inf", allow_inf=False)


@given(st.integers(min_value=0, max_value=10**6))
def test_bare_seconds_round_trip(n):
    assert parse_duration(str(n)) == n


@given(
    st.lists(st.sampled_from(["d", "h", "m", "s", "ms"]), min_size=1, unique=True),
    st.lists(st.integers(min_value=0, max_value=999), min_size=5, max_size=5),
)
def test_composed_durations_sum_their_parts(units, counts):
    order = ["d", "h", "m", "s", "ms"]
    units = sorted(units, key=order.index)
    size = {"d": 86400, "h": 3600, "m": 60, "s": 1, "ms": 0.001}
    parts = list(zip(counts[: len(units)], units, strict=True))
    text = "".join(f"{c}{u}" for c, u in parts)
    assert parse_duration(text) == pytest.approx(sum(c * size[u] for c, u in parts))


@given(st.text())
def test_parse_duration_never_crashes(text):
    try:
        value = parse_duration(text)
    except UsageError:
        return
    assert value >= 0


@given(st.floats(min_value=0, max_value=10**7, allow_nan=False))
def test_format_duration_is_parseable(seconds):
    assert parse_duration(format_duration(seconds)) >= 0


@given(st.text(min_size=1, max_size=200))
def test_validate_key_accepts_or_refuses_cleanly(key):
    try:
        assert validate_key(key) == key
    except UsageError as error:
        assert "key" in str(error)
    else:
        assert not any(ord(c) < 32 or 127 <= ord(c) < 160 for c in key)


def test_key_limits():
    validate_key("x" * 512)
    with pytest.raises(UsageError):
        validate_key("x" * 513)
    with pytest.raises(UsageError):
        validate_key("é" * 257)  # 514 bytes
    with pytest.raises(UsageError):
        validate_key("bad\udcffkey")  # invalid UTF-8 from argv


@pytest.mark.parametrize(
    ("prefix", "upper"),
    [
        ("app:", "app;"),
        ("a", "b"),
        ("", None),
        ("z\U0010ffff", "{"),
        ("\U0010ffff", None),
        ("x\ud7ff", "x\ue000"),
    ],
)
def test_prefix_upper_bound(prefix, upper):
    from tasklock_cli.stores.model import prefix_upper_bound

    assert prefix_upper_bound(prefix) == upper


@given(st.text(min_size=1, max_size=5), st.text(max_size=5))
def test_every_key_with_the_prefix_sorts_below_the_bound(prefix, rest):
    from tasklock_cli.stores.model import prefix_upper_bound

    upper = prefix_upper_bound(prefix)
    key = prefix + rest
    assert upper is None or key < upper
    assert key >= prefix


#: The regular expressions durations were read with before util.durations read them by
#: hand (issue 45: re is off `run`'s path): the oracle of the reading below.
_OLD_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_OLD_BARE_NUMBER = re.compile(r"\d+(?:\.\d+)?")
_OLD_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def _old_finite_seconds(raw: str) -> float | None:
    if not raw.isascii():
        return None
    if _OLD_BARE_NUMBER.fullmatch(raw):
        return float(raw)
    if raw and _OLD_PART.sub("", raw) == "":
        order = ["d", "h", "m", "s", "ms"]
        positions = [order.index(unit) for _, unit in _OLD_PART.findall(raw)]
        if positions == sorted(set(positions)):
            return sum(float(n) * _OLD_UNIT_SECONDS[u] for n, u in _OLD_PART.findall(raw))
    return None


#: Strings made mostly of what durations are made of, so that most are near misses.
_duration_like = st.text(alphabet=st.sampled_from("0123456789.smhdx ٣-+e"), max_size=14)


@given(st.one_of(_duration_like, st.text(max_size=12)))
def test_durations_read_by_hand_as_the_regular_expressions_read_them(raw):
    assert _finite_seconds(raw) == _old_finite_seconds(raw)


@pytest.mark.parametrize(
    "raw",
    ["1ms", "1m", "1m1s", "1.ms", "1.5ms", "1.5.3s", "1h.5m", "5s1h", "1m1m", "1d2h3m4s5ms",
     "", "1", "1.", ".5", "0.5", "00", "1m5", "ms", "1s ", "9" * 400, "9" * 400 + "d"],
)  # fmt: skip
def test_durations_read_by_hand_on_the_edge_cases(raw):
    assert _finite_seconds(raw) == _old_finite_seconds(raw)
