"""``trainers.allocator``: glibc's thresholds for training, only where they are ours to set."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from budgetplan.errors import InvalidParameterError
from trainers import allocator
from trainers.allocator import MMAP_THRESHOLD, TRIM_THRESHOLD, tune_allocator

GLIBC = allocator._glibc() is not None

# A fresh process takes training steps of a small MLP at batch 4,096 (its activations are 2 MiB
# each: the pattern of allocations the trainer makes), 40 with glibc's defaults, then 40 tuned,
# and reports the page faults of the last 30 of each.
_FAULTS = """
import json, resource, torch
from trainers.allocator import tune_allocator
torch.set_num_threads(1)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.ReLU(), torch.nn.Linear(128, 128), torch.nn.ReLU(),
                            torch.nn.Linear(128, 1))
x, y = torch.randn(4096, 32), torch.rand(4096, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

def faults():
    counts = []
    for _ in range(40):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.binary_cross_entropy_with_logits(model(x), y).backward()
        opt.step()
        counts.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    return sum(counts[10:])

system = faults()
tuned = tune_allocator()
print(json.dumps({"system": system, "tuned": tuned, "tuned_faults": faults()}))
"""


@pytest.mark.skipif(not GLIBC, reason="glibc's allocator only")
def test_training_steps_reuse_freed_memory_instead_of_faulting_in_fresh_pages():
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = json.loads(subprocess.run([sys.executable, "-c", _FAULTS], capture_output=True, text=True, env=env,
                                    check=True).stdout)
    block = (2 << 20) // 4096  # the pages of one 2 MiB activation
    if out["system"] < 16 * block:
        pytest.skip(f"glibc's defaults already fault in few pages here ({out['system']} in 30 steps)")
    assert out["tuned"] is True
    # measured over 10 processes: 6,500-30,000 faults in 30 steps with glibc's defaults (fresh
    # mappings of the step's tensors, about 3 to 15 of its 2 MiB blocks a step); tuned, 0-2,048
    # (a block now and then)
    assert out["tuned_faults"] <= 8 * block and out["tuned_faults"] < out["system"] / 2, out


class _FakeLibc:
    def __init__(self, result: int = 1):
        self.calls: list[tuple[int, int]] = []
        self.result = result

    def mallopt(self, param: int, value: int) -> int:
        self.calls.append((param, value))
        return self.result


@pytest.fixture
def fake_libc(monkeypatch):
    libc = _FakeLibc()
    monkeypatch.setattr(allocator, "_glibc", lambda: libc)
    return libc


def test_sets_both_thresholds_and_hands_them_to_child_processes(fake_libc):
    environ: dict[str, str] = {"MALLOC_ARENA_MAX": "2", "OMP_NUM_THREADS": "1"}  # not ours, not in the way
    assert tune_allocator(environ) is True
    assert fake_libc.calls == [(-3, MMAP_THRESHOLD), (-1, TRIM_THRESHOLD)]
    assert environ["MALLOC_MMAP_THRESHOLD_"] == str(32 << 20) and environ["MALLOC_TRIM_THRESHOLD_"] == str(1 << 30)
    assert tune_allocator(environ) is True  # again, e.g. in a child that inherited them: harmless
    assert len(fake_libc.calls) == 4


@pytest.mark.parametrize("name, value", [("MALLOC_MMAP_THRESHOLD_", "65536"), ("MALLOC_TRIM_THRESHOLD_", "0"),
                                         ("MALLOC_TOP_PAD_", "0"), ("MALLOC_MMAP_MAX_", "0"),
                                         ("MALLOC_CONF", "background_thread:true"),
                                         ("LD_PRELOAD", "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2")])
def test_leaves_the_operators_allocator_alone(fake_libc, name, value):
    environ = {name: value}
    assert tune_allocator(environ) is False
    assert fake_libc.calls == [] and environ == {name: value}


def test_the_opt_out_and_a_bad_value(fake_libc):
    environ = {"BUDGETPLAN_ALLOCATOR": "system"}
    assert tune_allocator(environ) is False and fake_libc.calls == [] and environ == {"BUDGETPLAN_ALLOCATOR": "system"}
    assert tune_allocator({"BUDGETPLAN_ALLOCATOR": "tuned"}) is True
    with pytest.raises(InvalidParameterError, match="""must be "tuned" or "system", got 'jemalloc'"""):
        tune_allocator({"BUDGETPLAN_ALLOCATOR": "jemalloc"})


def test_a_bad_opt_out_is_one_line_and_writes_nothing(monkeypatch, runner, tmp_path):
    from budgetplan.cli import cli

    monkeypatch.setenv("BUDGETPLAN_ALLOCATOR", "off")
    out = runner.invoke(cli, ["demo", "--rows", "6000", "--out", str(tmp_path / "demo")])
    assert out.exit_code in (1, 2) and "BUDGETPLAN_ALLOCATOR" in out.stderr and "'off'" in out.stderr
    assert out.stderr.strip().count("\n") == 0 and not (tmp_path / "demo").exists()


def test_does_nothing_without_glibc(monkeypatch):
    monkeypatch.setattr(allocator.platform, "libc_ver", lambda: ("", ""))
    environ: dict[str, str] = {}
    assert tune_allocator(environ) is False and environ == {}


def test_a_refused_setting_is_reported_and_not_handed_on(monkeypatch):
    libc = _FakeLibc(result=0)
    monkeypatch.setattr(allocator, "_glibc", lambda: libc)
    environ: dict[str, str] = {}
    assert tune_allocator(environ) is False and environ == {}
