"""The result of comparing two runs' outputs (``xlaport.verify.outputs``,
``xlaport.verify.printed``): one entry an output, and what was left out."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import List


@dataclass
class Compared:
    name: str
    ok: bool
    max_abs_err: float
    max_rel_err: float


@dataclass
class Comparison:
    outputs: List[Compared] = field(default_factory=list)
    varies: List[str] = field(default_factory=list)  # left out: differ between reference runs
    # a line's timings, dates or sizes, left out by their form (its other numbers compared)
    by_form: List[str] = field(default_factory=list)
    not_compared: List[str] = field(default_factory=list)  # with the reason
    float_order: List[str] = field(default_factory=list)  # agree within the original's own float-order noise


def close_numbers(a: float, b: float, rtol: float, atol: float) -> bool:
    return math.isclose(a, b, rel_tol=rtol, abs_tol=atol) or (math.isnan(a) and math.isnan(b))

