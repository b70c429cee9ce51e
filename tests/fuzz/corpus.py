"""The whole corpus: generated option cases and hand-written ones, ids unique."""

from __future__ import annotations

from tests.fuzz.corpus_files import file_cases
from tests.fuzz.corpus_forged import forged_cases
from tests.fuzz.corpus_misc import misc_cases
from tests.fuzz.corpus_options import option_cases
from tests.fuzz.corpus_outputs import output_cases
from tests.fuzz.corpus_scenarios import scenario_cases

__all__ = ["CASES"]


def _all():
    cases = option_cases() + scenario_cases() + file_cases() + output_cases() + misc_cases() + forged_cases()
    seen = set()
    for case in cases:
        if case.id in seen:
            raise ValueError(f"duplicate case id {case.id}")
        seen.add(case.id)
    return cases


CASES = _all()
