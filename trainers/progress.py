"""Progress bars for long work: rich, on stderr, gone when done."""

from __future__ import annotations

__all__ = ["bar"]


def bar(label: str | None, total: int):
    """(progress, task) for ``total`` units of work, or None when ``label`` is None or nothing to do."""
    if label is None or total <= 0:
        return None
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    progress = Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                        console=Console(stderr=True), transient=True)
    progress.start()
    return progress, progress.add_task(label, total=total)
