"""Rich tables for the accounting commands; the same content the JSON carries."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, TypeAlias

if TYPE_CHECKING:
    from rich.table import Table

__all__ = ["Cell", "fmt", "params_table", "results_table"]

# A table cell: text shown as is, a number (or None) shown by ``fmt``.
Cell: TypeAlias = "str | float | None"


def fmt(x: float | None, digits: int = 6) -> str:
    """A number as a user wants to read it: inf spelled out, small values in e-notation."""
    if x is None:
        return "-"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return f"{x:,}"
    if not math.isfinite(x):
        return "inf" if x > 0 else "nan"
    return f"{x:.{digits}g}"


def params_table(title: str, rows: Sequence[tuple[str, Cell]]) -> Table:
    from rich.table import Table

    table = Table(title=title, show_header=False, title_justify="left", box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column()
    for name, value in rows:
        table.add_row(name, value if isinstance(value, str) else fmt(value))
    return table


def _numberish(value: object) -> bool:
    """A number, or text that reads as one (a formatted number, "-" for none, "12.3%")."""
    if not isinstance(value, str):
        return True
    text = value.strip().rstrip("%x").replace(",", "")
    if text in ("", "-", "n/a"):
        return True
    try:
        float(text)
    except ValueError:
        return False
    return True


def results_table(title: str, columns: list[str], rows: Sequence[Sequence[Cell]]) -> Table:
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    for i, col in enumerate(columns):
        # numbers align right; text (descriptions, details, pass/fail) reads better left
        numeric = all(_numberish(row[i]) for row in rows)
        table.add_column(col, justify="right" if i and numeric else "left", overflow="fold")
    for row in rows:
        table.add_row(*[v if isinstance(v, str) else fmt(v) for v in row])
    return table
