import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from budgetplan.errors import InvalidParameterError
from budgetplan.util import validate as v


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, 0.0, -1.0, True, "1", None])
def test_positive_rejects_with_name_and_value(bad):
    with pytest.raises(InvalidParameterError) as err:
        v.positive("epsilon", bad)
    msg = str(err.value)
    assert msg.startswith("epsilon must be")
    assert "\n" not in msg
    assert repr(bad if not isinstance(bad, float) else float(bad)) in msg or str(bad) in msg


@pytest.mark.parametrize("bad", [0.0, 1.0, 1.5, -0.1, math.nan])
def test_open_unit(bad):
    with pytest.raises(InvalidParameterError, match="delta must be in \\(0, 1\\)"):
        v.open_unit("delta", bad)


def test_probability_ends():
    assert v.probability("q", 1.0, allow_one=True) == 1.0
    assert v.probability("d", 0.0, allow_zero=True) == 0.0
    with pytest.raises(InvalidParameterError):
        v.probability("q", 0.0)


@pytest.mark.parametrize("bad", [0, -3, 2.5, math.nan, math.inf, True, "3"])
def test_positive_int(bad):
    with pytest.raises(InvalidParameterError, match="steps must be an integer >= 1"):
        v.positive_int("steps", bad)


def test_whole_floats_are_integers():
    assert v.positive_int("steps", 3.0) == 3
    assert isinstance(v.positive_int("steps", 3.0), int)


@given(st.floats(allow_nan=True, allow_infinity=True))
def test_positive_accepts_exactly_finite_positive(x):
    if math.isfinite(x) and x > 0:
        assert v.positive("x", x) == x
    else:
        with pytest.raises(InvalidParameterError):
            v.positive("x", x)
