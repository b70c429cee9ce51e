"""The run directory's checkpoint: a typed value on either side of a file that keeps its dict form."""

import pytest
import torch

from budgetplan.errors import InvalidParameterError
from budgetplan.util.fileio import torch_save
from trainers.session import Checkpoint, NullSession

MODEL = {"w": torch.arange(3.0)}
OPT = {"state": {}, "param_groups": [{"lr": 0.1, "params": [0]}]}


def same(a: Checkpoint, b: Checkpoint) -> bool:
    return (a.phase, a.step, a.optimizer, a.rr_result) == (b.phase, b.step, b.optimizer, b.rr_result) and all(
        torch.equal(a.model[k], b.model[k]) for k in a.model) and set(a.model) == set(b.model)


@pytest.mark.parametrize("ckpt", [
    Checkpoint(phase="dpsgd", step=10, model=MODEL, optimizer=OPT),
    Checkpoint(phase="dpsgd", step=0, model=MODEL, optimizer=OPT, rr_result="the RR phase's result"),
    Checkpoint(phase="rr-done", model=MODEL, rr_result="the RR phase's result"),
], ids=["dpsgd", "hybrid-dpsgd", "rr-done"])
def test_file_round_trip_keeps_the_dict_form(ckpt, tmp_path):
    torch_save(ckpt.to_state(), tmp_path / "checkpoint.pt")
    state = torch.load(tmp_path / "checkpoint.pt", weights_only=False)
    assert type(state) is dict and set(state) == {k for k in ("phase", "step", "model", "optimizer", "rr_result")
                                                  if getattr(ckpt, k) is not None}
    assert same(Checkpoint.from_state(state), ckpt)


def test_a_checkpoint_written_as_a_dict_before_the_type_resumes():
    old = {"phase": "dpsgd", "step": 5, "model": MODEL, "optimizer": OPT, "rr_result": None}
    assert Checkpoint.from_state(old).dpsgd_step == 5
    assert Checkpoint.from_state({"phase": "rr-done", "model": MODEL, "rr_result": 1}).dpsgd_step == 0


@pytest.mark.parametrize(("state", "message"), [
    ({"phase": "dpsgd", "step": 5, "model": MODEL, "optimizer": OPT, "lr": 0.1}, "unknown field 'lr'"),
    ({"step": 5, "model": MODEL, "optimizer": OPT}, "missing the field 'phase'"),
    ({"phase": "dpsgd", "step": 5, "optimizer": OPT}, "missing the field 'model'"),
    ({"phase": "walr", "model": MODEL}, "checkpoint phase must be one of"),
    ({"phase": "dpsgd", "step": -1, "model": MODEL, "optimizer": OPT}, "checkpoint step"),
    ({"phase": "dpsgd", "step": 3, "model": MODEL}, "holds the optimizer state"),
    ({"phase": "rr-done", "model": MODEL}, "holds the RR phase's result"),
    ([1, 2], "checkpoint must hold a dict"),
])
def test_a_malformed_checkpoint_is_refused_naming_the_field(state, message):
    with pytest.raises(InvalidParameterError, match=message):
        Checkpoint.from_state(state)


def test_without_a_run_directory_nothing_is_saved_or_loaded():
    session = NullSession()
    session.save_checkpoint(Checkpoint(phase="rr-done", model=MODEL, rr_result=1))
    assert session.load_checkpoint() is None
