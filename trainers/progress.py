"""Progress for long work, on stderr: a rich bar in a terminal, plain lines in a log.

A rich bar drawn to a file or pipe shows nothing until it ends, so ``budgetplan demo > log
2>&1`` used to stay silent for minutes. When stderr is not a terminal, ``bar`` writes a
line at most every ``LOG_EVERY_S`` seconds (and at most one per tenth of the work) and one
when the work stops: what, how far, how long; each starts with ``PREFIX``.
"""

from __future__ import annotations

import sys
import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

__all__ = ["bar", "LOG_EVERY_S", "LogLines", "PREFIX"]

LOG_EVERY_S = 10.0  # the most often a log line is written while work runs
PREFIX = "progress: "  # every log line starts so: a reader (or a grep) tells it from warnings and errors


class LogLines:
    """The bar's interface (``advance``, ``stop``) as lines on a stream: for logs and pipes.

    Work shorter than ``LOG_EVERY_S`` writes nothing (a quick refusal stays one error line);
    longer work writes a line every ``LOG_EVERY_S`` seconds at most and at most one per tenth
    of the work, then one when it stops (done, or stopped short of its total).
    """

    def __init__(self, label: str, total: int, stream=None, clock=time.monotonic):
        self.label, self.total, self.done = label, total, 0
        self._stream = stream if stream is not None else sys.stderr
        self._clock = clock
        self._start = self._last = clock()
        self._last_done = 0
        self._shown = False

    def advance(self, _task=None, advance: int = 1) -> None:
        self.done += advance
        now = self._clock()
        if now - self._last >= LOG_EVERY_S and (self.done - self._last_done) * 10 >= self.total:
            elapsed = now - self._start
            left = elapsed * (self.total - self.done) / self.done if self.done else float("nan")
            self._write(f"{self.label}: {self.done:,}/{self.total:,} ({100 * self.done / self.total:.0f}%), "
                        f"{elapsed:.0f} s elapsed, about {left:.0f} s left")
            self._last, self._last_done = now, self.done

    def stop(self) -> None:
        elapsed = self._clock() - self._start
        if not self._shown and elapsed < LOG_EVERY_S:
            return
        how = "done" if self.done >= self.total else "stopped at"
        self._write(f"{self.label}: {how} {self.done:,}/{self.total:,} in {elapsed:.1f} s")

    def _write(self, line: str) -> None:
        self._shown = True
        print(f"{PREFIX}{line}", file=self._stream, flush=True)


def bar(label: str | None, total: int):
    """(progress, task) for ``total`` units of work, or None when ``label`` is None or nothing to do.

    ``progress.advance(task, n)`` and ``progress.stop()``; a rich bar when stderr is a
    terminal (gone when done), ``LogLines`` otherwise.
    """
    if label is None or total <= 0:
        return None
    if not sys.stderr.isatty():
        return LogLines(label, total), None

    progress = Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                        console=Console(stderr=True), transient=True)
    progress.start()
    return progress, progress.add_task(label, total=total)
