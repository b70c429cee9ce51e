import math

import pytest

from budgetplan.errors import InvalidParameterError
from budgetplan.mechanisms import (
    Composition,
    GaussianRelease,
    PoissonDPSGD,
    RandomizedResponse,
    TruncatedPoissonDPSGD,
    mechanism_from_dict,
    mechanism_to_dict,
)
from budgetplan.units import Adjacency, PrivacyUnit


def test_adjacency_parse():
    assert Adjacency.parse("add-remove") is Adjacency.ADD_REMOVE
    assert Adjacency.parse(Adjacency.REPLACE_ONE) is Adjacency.REPLACE_ONE
    with pytest.raises(InvalidParameterError, match="adjacency must be one of add-remove, replace-one, got 'swap'"):
        Adjacency.parse("swap")


def test_units():
    assert PrivacyUnit.example().is_example_level
    u = PrivacyUnit.capped(8, name="user x time")
    assert (u.cap, u.capping, u.is_example_level) == (8, "random", False)
    assert PrivacyUnit.from_dict(u.to_dict()) == u
    with pytest.raises(InvalidParameterError, match="unit cap must be an integer >= 1, got 0"):
        PrivacyUnit.capped(0)
    with pytest.raises(InvalidParameterError, match="capping must be one of random, first"):
        PrivacyUnit.capped(3, capping="last")


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: RandomizedResponse(epsilon=math.nan), "epsilon must be a finite number > 0, got nan"),
        (lambda: GaussianRelease(noise_std=1.0, sensitivity=0), "sensitivity must be a finite number > 0, got 0"),
        (lambda: PoissonDPSGD(noise_multiplier=math.inf, sampling_rate=0.1, steps=1), "noise_multiplier"),
        (lambda: PoissonDPSGD(noise_multiplier=1.0, sampling_rate=1.5, steps=1), "sampling_rate must be in"),
        (lambda: PoissonDPSGD(noise_multiplier=1.0, sampling_rate=0.1, steps=0), "steps must be an integer >= 1"),
        (lambda: TruncatedPoissonDPSGD(noise_multiplier=1.0, sampling_rate=0.1, steps=1, dataset_size=10,
                                       max_batch_size=11), "max_batch_size must be <= dataset_size"),
        (lambda: Composition(phases=()), "phases must contain at least one mechanism"),
        (lambda: Composition(phases=(1.0,)), r"phases\[0\] must be a mechanism"),
    ],
)
def test_constructors_validate(make, match):
    with pytest.raises(InvalidParameterError, match=match):
        make()


def test_mechanisms_are_frozen_and_keyword_only():
    m = PoissonDPSGD(noise_multiplier=1.0, sampling_rate=0.01, steps=10)
    from dataclasses import FrozenInstanceError

    with pytest.raises(FrozenInstanceError):
        m.steps = 11
    with pytest.raises(TypeError):
        PoissonDPSGD(1.0, 0.01, 10)


def test_round_trip_every_kind():
    hybrid = Composition(phases=(
        RandomizedResponse(epsilon=3.0),
        Composition(phases=(PoissonDPSGD(noise_multiplier=0.9, sampling_rate=5e-4, steps=100),)),
        GaussianRelease(noise_std=2.0, sensitivity=0.5),
        TruncatedPoissonDPSGD(noise_multiplier=1.0, sampling_rate=0.01, steps=5, dataset_size=1000,
                              max_batch_size=20),
    ))
    assert mechanism_from_dict(mechanism_to_dict(hybrid)) == hybrid
    assert len(hybrid.leaves()) == 4


def test_from_dict_rejects_unknown():
    with pytest.raises(InvalidParameterError, match="unknown field for RandomizedResponse: 'flips'"):
        mechanism_from_dict({"type": "RandomizedResponse", "epsilon": 1.0, "flips": 2})
    with pytest.raises(InvalidParameterError, match="mechanism type must be one of"):
        mechanism_from_dict({"type": "Laplace"})
