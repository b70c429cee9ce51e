"""The whole corpus: generated option cases and hand-written ones, ids unique."""

from __future__ import annotations

from tests.fuzz.corpus_options import option_cases

__all__ = ["CASES"]


def _all():
    cases = option_cases()
    seen = set()
    for case in cases:
        if case.id in seen:
            raise ValueError(f"duplicate case id {case.id}")
        seen.add(case.id)
    return cases


CASES = _all()
