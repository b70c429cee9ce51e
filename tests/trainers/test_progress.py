"""Long work in a log: plain lines on stderr when it is not a terminal (a rich bar shows nothing there)."""

import io

from trainers import progress
from trainers.progress import LOG_EVERY_S, PREFIX, LogLines


class _Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_a_log_gets_a_start_a_bounded_number_of_updates_and_an_end():
    out, clock = io.StringIO(), _Clock()
    lines = LogLines("DP-SGD phase", 1000, stream=out, clock=clock)
    for _ in range(1000):
        clock.now += 0.5  # 500 s of work: one line per LOG_EVERY_S at most, and per tenth of the work
        lines.advance(None)
    lines.stop()
    text = out.getvalue().splitlines()
    assert all(line.startswith(PREFIX + "DP-SGD phase: ") for line in text)
    assert text[-1].endswith("done 1,000/1,000 in 500.0 s")
    updates = text[:-1]
    assert 1 <= len(updates) <= 10  # a tenth of the work (50 s) is the binding limit here
    assert "100/1,000 (10%), 50 s elapsed, about 450 s left" in updates[0]


def test_quick_work_writes_nothing_so_a_quick_refusal_stays_one_line():
    out, clock = io.StringIO(), _Clock()
    lines = LogLines("RR phase", 10, stream=out, clock=clock)
    for _ in range(3):
        clock.now += LOG_EVERY_S / 100
        lines.advance(None, 1)
    lines.stop()
    assert out.getvalue() == ""


def test_work_stopped_short_says_so():
    out, clock = io.StringIO(), _Clock()
    lines = LogLines("capping", 100, stream=out, clock=clock)
    clock.now += 2 * LOG_EVERY_S
    lines.advance(None, 40)
    lines.stop()
    assert out.getvalue().splitlines()[-1] == PREFIX + f"capping: stopped at 40/100 in {2 * LOG_EVERY_S:.1f} s"


def test_bar_writes_lines_when_stderr_is_not_a_terminal(capsys, monkeypatch):
    monkeypatch.setattr(progress, "LOG_EVERY_S", 0.0)
    shown = progress.bar("synthesising", 5)
    assert isinstance(shown[0], LogLines)
    shown[0].advance(shown[1], 5)
    shown[0].stop()
    err = capsys.readouterr().err
    assert err.startswith(PREFIX + "synthesising: 5/5 (100%)") and "done 5/5 in" in err
    assert progress.bar(None, 5) is None and progress.bar("x", 0) is None
