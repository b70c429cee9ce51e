"""The fuzz corpus: every case a clean refusal or a complete, valid run (see ``harness.py``)."""

from __future__ import annotations

import pytest

from tests.fuzz.artefacts import Artefacts
from tests.fuzz.corpus import CASES
from tests.fuzz.harness import run_case


@pytest.fixture(scope="session")
def artefacts(tmp_path_factory):
    return Artefacts(tmp_path_factory.mktemp("fuzz-artefacts"))


@pytest.fixture(scope="session", autouse=True)
def _one_torch_thread():
    # The corpus trains a few tiny models; on a shared 2-core runner torch's thread pool
    # fights the other processes for cores and a 0.1 s step takes seconds.
    try:
        import torch
    except ImportError:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _param(case):
    marks = []
    if case.xfail:
        marks.append(pytest.mark.xfail(strict=False, reason=case.xfail))
    return pytest.param(case, id=case.id, marks=marks)


@pytest.mark.parametrize("case", [_param(c) for c in CASES])
def test_case(case, artefacts, tmp_path, monkeypatch):
    import os

    if not case.root_ok and os.geteuid() == 0:
        pytest.skip("root reads any file: the refusal this case checks cannot happen")
    outcome = run_case(case, tmp_path, artefacts, monkeypatch)
    assert not outcome.problems, (f"{case.id}: budgetplan {' '.join(case.argv)}\n" + "\n".join(outcome.problems)
                                  + f"\nexit {outcome.exit_code}\nstderr: {outcome.stderr}")


def test_corpus_is_large_and_reaches_every_command():
    import click

    from budgetplan.cli import cli

    assert len(CASES) >= 500
    assert len({c.id for c in CASES}) == len(CASES)
    assert {"reject", "accept", "interrupted"} <= {c.expect for c in CASES}

    def leaves(group, path=()):
        for name, cmd in group.commands.items():
            if isinstance(cmd, click.Group):
                yield from leaves(cmd, path + (name,))
            else:
                yield path + (name,)

    reached = {c.argv[:2] for c in CASES} | {c.argv[:1] for c in CASES}
    missing = [" ".join(p) for p in leaves(cli) if p not in reached]
    assert not missing, f"commands without a case: {missing}"
