"""The per-step evidence of a DP-SGD session, as the private record holds it (read strictly).

The trainer (``trainers.evidence``) measures what each noisy step did and the private
record's DP-SGD statistics keep it under ``evidence``; the audit tests it
(``budgetplan.audit.step_evidence``). It is a statistic of the run's secret noise and sampling,
not of the data, and stays private all the same (the noise must stay secret):

    noise_ranks   [[rank, ...], ...]   per step, the ranks that drew its noise (one, honestly)
    noise_draws   [int, ...]           per step, the standard normal draws made
    noise_chi2    [float, ...]         per step, the sum of their squares
    participation [{"whole": bool, "counts": {"times": rows}}, ...]
                                       allocation and shuffled batches: per epoch, how many rows
                                       took part how many times (absent otherwise)
    unit_blocks, units_split  int      unit sampling: the sampled unit blocks checked, and those
                                       that were not one whole unit (absent otherwise)
"""

from __future__ import annotations

from typing import Any

from budgetplan.errors import InvalidParameterError
from budgetplan.util import validate

__all__ = ["read_evidence"]

_KEYS = ("noise_ranks", "noise_draws", "noise_chi2")
_OPTIONAL = ("participation", "unit_blocks", "units_split")


def _list(name: str, value: object) -> list[Any]:
    if not isinstance(value, list):
        raise InvalidParameterError(f"{name} must be a list, got {type(value).__name__}")
    return value


def read_evidence(value: object) -> dict[str, Any]:
    """``value`` checked as the evidence of one session (see the module docstring), or a one-line error naming
    the field."""
    if not isinstance(value, dict):
        raise InvalidParameterError(f"evidence must be a JSON object, got {type(value).__name__}")
    unknown = sorted(set(value) - set(_KEYS) - set(_OPTIONAL))
    if unknown:
        raise InvalidParameterError(f"evidence has an unknown field {unknown[0]!r}")
    missing = [k for k in _KEYS if k not in value]
    if missing:
        raise InvalidParameterError(f"evidence lacks {missing[0]!r}")
    ranks, draws, chi2 = (_list(f"evidence.{k}", value[k]) for k in _KEYS)
    if not len(ranks) == len(draws) == len(chi2):
        raise InvalidParameterError(f"evidence lists {len(ranks)} steps of noise ranks, {len(draws)} of draws and "
                                    f"{len(chi2)} of sums of squares")
    for i, step in enumerate(ranks):
        for r in _list(f"evidence.noise_ranks[{i}]", step):
            validate.non_negative_int(f"evidence.noise_ranks[{i}][]", r)
    for i, d in enumerate(draws):
        validate.non_negative_int(f"evidence.noise_draws[{i}]", d)
    for i, s in enumerate(chi2):
        validate.non_negative(f"evidence.noise_chi2[{i}]", s)
    _participation(value.get("participation", []))
    for name in ("unit_blocks", "units_split"):
        if name in value:
            validate.non_negative_int(f"evidence.{name}", value[name])
    if ("unit_blocks" in value) != ("units_split" in value):
        raise InvalidParameterError("evidence.unit_blocks and evidence.units_split go together")
    return value


def _participation(value: object) -> None:
    for i, epoch in enumerate(_list("evidence.participation", value)):
        if not isinstance(epoch, dict) or set(epoch) != {"whole", "counts"} or not isinstance(epoch["whole"], bool) \
                or not isinstance(epoch["counts"], dict):
            raise InvalidParameterError(f"evidence.participation[{i}] must be {{\"whole\": bool, \"counts\": "
                                        f"{{times: rows}}}}, got {epoch!r}")
        for times, rows in epoch["counts"].items():
            if not times.isdigit():
                raise InvalidParameterError(f"evidence.participation[{i}].counts has a key {times!r}, not a count")
            validate.positive_int(f"evidence.participation[{i}].counts[{times}]", rows)
