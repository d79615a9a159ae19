"""util.jsontext against the json module: the same text written, byte for byte, and the same
values read (NaN and the infinities included), or the same exception."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tasklock_cli.util import jsontext

#: Every character, lone surrogates, C0, C1 and DEL included.
_characters = st.characters(blacklist_categories=())
_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(10**40), max_value=10**40),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(_characters, max_size=8),
)
_keys = st.one_of(st.text(_characters, max_size=6), st.integers(), st.floats(), st.booleans())
_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.lists(inner, max_size=3).map(tuple),
        st.dictionaries(_keys, inner, max_size=4),
    ),
    max_leaves=12,
)
_options = st.fixed_dictionaries(
    {},
    optional={
        "ensure_ascii": st.booleans(),
        "sort_keys": st.booleans(),
        "allow_nan": st.booleans(),
        "skipkeys": st.booleans(),
        "check_circular": st.booleans(),
        "separators": st.sampled_from([(",", ":"), (", ", ": "), (";", "=")]),
    },
)


def outcome(call, *args, **options):
    """What ``call`` returns, or the type and words of what it raises."""
    try:
        return ("value", call(*args, **options))
    except (TypeError, ValueError) as exc:
        return ("raised", type(exc), str(exc))


def same(a: object, b: object) -> bool:
    """Equal, types included, with NaN equal to NaN."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        assert isinstance(b, float)
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, list):
        assert isinstance(b, list)
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        assert isinstance(b, dict)
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    return a == b


@given(_values, _options)
def test_dumps_writes_what_json_writes(value, options):
    assert outcome(jsontext.dumps, value, **options) == outcome(json.dumps, value, **options)


@given(_values)
def test_dumps_with_a_default_and_objects_it_cannot_write(value):
    odd = [value, {1, 2}, object.__new__(type("Odd", (), {}))]
    assert outcome(jsontext.dumps, odd) == outcome(json.dumps, odd)
    shown = jsontext.dumps(odd[:2], default=str, ensure_ascii=False)
    assert shown == json.dumps(odd[:2], default=str, ensure_ascii=False)


def test_dumps_leaves_what_it_does_not_cover_to_json():
    value = {"b": [1, 2.5], "a": None}
    assert jsontext.dumps(value, indent=2) == json.dumps(value, indent=2)


def test_a_value_refers_to_itself():
    loop: list = []
    loop.append(loop)
    assert outcome(jsontext.dumps, loop) == outcome(json.dumps, loop)


@given(_values, st.sampled_from(["", " ", "\n\t", "\r\n "]), st.booleans())
def test_loads_reads_what_json_reads(value, space, ensure_ascii):
    text = space + json.dumps(value, ensure_ascii=ensure_ascii) + space
    assert same(jsontext.loads(text), json.loads(text))


@given(st.text(st.sampled_from('{}[]",:0123456789.-+eE aNInfinitytrue\\u\x00\ufeff'), max_size=20))
def test_loads_of_near_json_reads_or_refuses_as_json_does(text):
    ours, theirs = outcome(jsontext.loads, text), outcome(json.loads, text)
    assert ours[0] == theirs[0]
    if ours[0] == "value":
        assert same(ours[1], theirs[1])
    else:
        assert ours == theirs


@pytest.mark.parametrize(
    "text",
    ["NaN", "[Infinity, -Infinity]", "1e400", "-0", "-0.0", '{"a": 1, "a": 2}', "1 2", "",
     " ", "\ufeff{}", '"\\ud800"', '"\\u00e9"', "[" * 5 + "]" * 5, "12345678901234567890123",
     b'{"a": 1}', bytearray(b"[1]"), "nul", '"x\x01"'],
)  # fmt: skip
def test_loads_on_the_edge_cases(text):
    ours, theirs = outcome(jsontext.loads, text), outcome(json.loads, text)
    assert ours[0] == theirs[0]
    assert same(ours[1], theirs[1]) if ours[0] == "value" else ours == theirs


def test_neither_json_nor_re_is_imported_for_valid_json(tmp_path):
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from tasklock_cli.util import jsontext\n"
        "value = jsontext.loads(jsontext.dumps({'a': [1, 2.5, None, 'é'], 'b': float('nan')}))\n"
        "jsontext.dumps(value, ensure_ascii=False, default=str)\n"
        "print(sorted({'json', 're', 'enum'} & set(sys.modules)))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.stdout.strip() == "[]", result.stderr
