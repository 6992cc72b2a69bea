"""The router reads request bodies with orjson and falls back to json for what
orjson refuses: every body must get the answer json alone gave it."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shoal.router.proxy import _parse_body, _parse_body_strictly

_INT64 = st.integers(min_value=-(2**63), max_value=2**64 - 1)
_LEAVES = st.none() | st.booleans() | _INT64 | st.floats(allow_nan=False) | st.text()
_VALUES = st.recursive(
    _LEAVES,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)
_BODIES = st.dictionaries(st.text(), _VALUES, max_size=5)


@settings(max_examples=300)
@given(body=_BODIES, model=st.text(min_size=1), ascii_only=st.booleans())
def test_any_body_reads_as_json_reads_it(
    body: dict[str, Any], model: str, ascii_only: bool
) -> None:
    raw = json.dumps({**body, "model": model}, ensure_ascii=ascii_only).encode()
    assert _parse_body(raw) == _parse_body_strictly(raw)


@pytest.mark.parametrize(
    "raw",
    [
        b'{"model": "m", "temperature": NaN}',  # json reads NaN and Infinity
        b'{"model": "m", "top_p": -Infinity}',
        b'\xef\xbb\xbf{"model": "m"}',  # a BOM
        b'{"model": "m", "prompt": "\\ud83d"}',  # a lone surrogate, as a cut emoji leaves
        b'{"model": "m", "prompt": "\xff"}',  # not UTF-8
        b'{"model": "m", "seed": 1e400}',
        b'{"model": "m",}',
        b"[" * 100_000 + b"]" * 100_000,  # deeper than orjson's limit (1024)
        b'{"model": ""}',
        b'["model"]',
        b"",
        b'{"model": "m", "messages": "hi"}',
    ],
)
def test_what_orjson_refuses_gets_json_s_answer(raw: bytes) -> None:
    assert _parse_body(raw) == _parse_body_strictly(raw)
