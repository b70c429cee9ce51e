"""The benchmarks' progress in a log: a rich bar written to a file shows nothing until it ends,
so a benchmark whose stderr is not a terminal writes plain lines instead."""

from __future__ import annotations

import io
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"


def _harness():
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    import harness

    return harness


def test_a_log_gets_a_line_per_start_change_and_step():
    from trainers.progress import PREFIX

    h = _harness()
    now = [0.0]
    out = io.StringIO()
    with h.LogProgress(stream=out, clock=lambda: now[0]) as bar:
        task = bar.add_task("utility frontier", total=4)
        now[0] = 75.0
        bar.update(task, description="balanced seed 0: baselines")
        bar.update(task, description="balanced seed 0: baselines")  # unchanged: no line
        bar.advance(task)
        bar.update(task, advance=2)
    lines = out.getvalue().splitlines()
    assert all(line.startswith(PREFIX) for line in lines)
    assert lines == [f"{PREFIX}utility frontier: started, 0/4 done, 0 s elapsed",
                     f"{PREFIX}balanced seed 0: baselines: now, 0/4 done, 75 s elapsed",
                     f"{PREFIX}balanced seed 0: baselines: advanced, 1/4 done, 75 s elapsed",
                     f"{PREFIX}balanced seed 0: baselines: advanced, 3/4 done, 75 s elapsed"]


def test_not_a_terminal_means_lines(monkeypatch):
    h = _harness()
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False, raising=False)
    assert isinstance(h.progress(), h.LogProgress)
