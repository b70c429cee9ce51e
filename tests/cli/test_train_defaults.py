"""`budgetplan train`'s option defaults are the trainer's: one set of defaults, whichever way a run starts."""

import dataclasses

import pytest

pytest.importorskip("torch")

from budgetplan.cli.train_cmds import train  # noqa: E402
from trainers.dpsgd import DPSGDSettings  # noqa: E402
from trainers.run import TrainSettings  # noqa: E402

# CLI parameter -> the settings field it sets.
_TRAIN = {"model": "model", "embedding_dim": "embedding_dim", "lr": "lr", "loss": "loss",
          "hybrid_start": "hybrid_start", "nonsensitive_encoding": "nonsensitive_encoding",
          "vocab_threshold": "vocab_threshold", "device": "device", "data_format": "data_format"}
_DPSGD = {"dpsgd_optimizer": "optimizer", "dpsgd_lr": "lr"}


def _cli_defaults():
    return {p.name: p.default for p in train.params}


@pytest.mark.parametrize("param,field", sorted(_TRAIN.items()))
def test_train_option_defaults_are_the_trainer_settings_defaults(param, field):
    default = TrainSettings.__dataclass_fields__[field].default
    assert str(_cli_defaults()[param]) == str(default), f"--{param.replace('_', '-')}"


@pytest.mark.parametrize("param,field", sorted(_DPSGD.items()))
def test_dpsgd_option_defaults_are_the_dpsgd_settings_defaults(param, field):
    cli_default = _cli_defaults()[param]  # "auto" on the command line is None in the settings (lr: 0.12/sqrt(T))
    assert (None if cli_default == "auto" else cli_default) == DPSGDSettings.__dataclass_fields__[field].default


def test_dpsgd_schedule_default_is_the_settings_default():
    assert (_cli_defaults()["dpsgd_schedule"] == "cosine") == DPSGDSettings().cosine_decay


class _Plan:
    def __init__(self, fixed):
        self.nonsensitive_fixed = fixed


def test_auto_encoding_is_a_vocabulary_only_where_the_columns_are_unprotected():
    assert TrainSettings().for_plan(_Plan(True)).nonsensitive_encoding == "vocab"
    assert TrainSettings().for_plan(_Plan(False)).nonsensitive_encoding == "hash"
    chosen = dataclasses.replace(TrainSettings(), nonsensitive_encoding="hash")
    assert chosen.for_plan(_Plan(True)) is chosen


def test_bad_encoding_names_the_parameter():
    from budgetplan.errors import InvalidParameterError

    with pytest.raises(InvalidParameterError, match="nonsensitive_encoding must be auto, vocab or hash, got 'x'"):
        TrainSettings(nonsensitive_encoding="x")
