"""The exception tree of budgetplan.

Every failure a user can cause is one of these; the CLI maps them to exit codes in one
place (``budgetplan.cli.shell``) and prints one line, never a traceback.

    BudgetplanError                      base of everything below
    ├── InvalidParameterError            exit 2: a value is not finite, out of range, not an integer
    ├── UnsupportedError                 exit 2: a combination no method here can account soundly
    ├── InfeasibleError                  exit 1: valid inputs, but no parameter meets the budget
    ├── AccountingError                  exit 1: a back-end failed or disagreed beyond its error band
    ├── PlanMismatchError                exit 1: a plan file whose hash, schema or numbers do not hold
    └── OutputError                      exit 1: a file could not be written (permissions, disk full, ...)

``InvalidParameterError`` is also a ``ValueError`` so that callers that already catch
``ValueError`` keep working.
"""

from __future__ import annotations

__all__ = [
    "BudgetplanError",
    "InvalidParameterError",
    "UnsupportedError",
    "InfeasibleError",
    "AccountingError",
    "PlanMismatchError",
    "OutputError",
]


class BudgetplanError(Exception):
    """Base class of every error budgetplan raises on purpose."""

    exit_code: int = 1


class InvalidParameterError(BudgetplanError, ValueError):
    """A parameter is NaN, infinite, out of range, or of the wrong kind.

    The message names the parameter and quotes the value, e.g.
    ``epsilon must be a finite number > 0, got nan``.
    """

    exit_code = 2


class UnsupportedError(BudgetplanError):
    """A mechanism, adjacency, unit and method combination that cannot be accounted soundly.

    Raised instead of silently falling back to a looser method; the message names the part
    that is unsupported and what would work instead.
    """

    exit_code = 2


class InfeasibleError(BudgetplanError):
    """The inputs are valid but no parameter value meets the requested budget.

    ``knob`` names the setting that would make the request feasible and ``suggestion``
    says by how much (e.g. the largest number of epochs), when one is known.
    """

    exit_code = 1

    def __init__(self, message: str, *, knob: str | None = None, suggestion: object = None):
        super().__init__(message)
        self.knob = knob
        self.suggestion = suggestion


class AccountingError(BudgetplanError):
    """An accounting back-end failed, or two independent methods disagreed beyond their bounds."""

    exit_code = 1


class PlanMismatchError(BudgetplanError):
    """A plan file failed verification: its hash, schema, form or recomputed numbers differ.

    ``problems`` lists every difference found, each naming what differs.
    """

    exit_code = 1

    def __init__(self, message: str, problems: list[str] | None = None):
        super().__init__(message)
        self.problems = list(problems or [message])


class OutputError(BudgetplanError):
    """A file could not be written: a read-only or missing directory, a full disk, a name
    the file system refuses. The message names the path and the operating system's reason;
    nothing was left half-written (``budgetplan.util.fileio``)."""

    exit_code = 1
