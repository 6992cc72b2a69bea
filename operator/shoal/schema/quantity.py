"""Kubernetes quantities (`80Gi`, `79.6Gi`, `512M`, `1e9`) as exact numbers.

Sizes are kept as the string the user wrote, as Kubernetes does for
int-or-string fields, and parsed to an exact Fraction where arithmetic needs
them, so `79.6Gi` is 79.6 x 2^30 bytes with no float rounding."""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Annotated, Any

from pydantic import BeforeValidator, WithJsonSchema

# Kubernetes' own quantity grammar, without the sign: no size here is negative.
PATTERN = (
    r"^(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
    r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
_QUANTITY = re.compile(PATTERN)
_NUMBER = re.compile(r"^(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))")

_BINARY = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}

GiB = 2**30
KiB = 2**10


def parse_quantity(text: str) -> Fraction:
    """The exact value of a quantity; ValueError naming the accepted forms otherwise."""
    text = text.strip()
    if not _QUANTITY.match(text):
        raise ValueError(
            f"{text!r} is not a Kubernetes quantity: write a number with an optional suffix, "
            "binary (Ki, Mi, Gi, Ti) or decimal (k, M, G, T), e.g. 80Gi or 79.6Gi"
        )
    number = _NUMBER.match(text)
    assert number is not None  # the full pattern matched, so its number part does
    value = Fraction(number.group(0))
    suffix = text[number.end() :]
    if suffix in _BINARY:
        return value * (1 << 10 * _BINARY[suffix])
    if suffix in _DECIMAL:
        return value * Fraction(10) ** _DECIMAL[suffix]
    exponent = Fraction(suffix[1:])  # an exponent: e9, E+6
    if exponent.denominator != 1:
        raise ValueError(f"{text!r}: write the exponent as a whole number, e.g. 1e9")
    return value * Fraction(10) ** int(exponent)


def _as_quantity_text(value: Any) -> Any:
    # YAML writes `memory: 85899345920` as an int; Kubernetes accepts both forms.
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        value = str(value)
    if isinstance(value, str):
        parse_quantity(value)
    return value


# A size field: the user's text, validated; int or string in the CRD, as core types do.
Quantity = Annotated[
    str,
    BeforeValidator(_as_quantity_text),
    WithJsonSchema(
        {
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "pattern": PATTERN,
            "x-kubernetes-int-or-string": True,
        }
    ),
]


def format_bytes(value: Fraction | int, unit: str = "GiB") -> str:
    """Bytes in GiB or KiB with one decimal (16.4 GiB); whole KiB without one (40 KiB)."""
    size = Fraction(value) / (GiB if unit == "GiB" else KiB)
    if unit == "KiB" and size.denominator == 1:
        return f"{size} KiB"
    return f"{float(size):.1f} {unit}"
