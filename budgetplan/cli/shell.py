"""The CLI's one error boundary, its number types, and its two output channels.

Exit codes: 0 ok, 1 a domain failure (infeasible budget, back-end failure, plan mismatch),
2 a usage error (bad number, unknown option, unsupported combination). A user never sees a
traceback for bad input: every error is one line on stderr.

Output: ``--json`` prints one JSON object alone on stdout; otherwise rich tables go to
stdout and warnings to stderr. rich honours NO_COLOR.
"""

from __future__ import annotations

import json
import math
import signal
import sys
from collections.abc import Callable, Mapping, Sequence
from types import FrameType
from typing import TYPE_CHECKING, Any, Literal, NoReturn, overload

import click

from budgetplan import limits
from budgetplan.errors import BudgetplanError, InvalidParameterError
from budgetplan.util import validate

if TYPE_CHECKING:
    from rich.console import Console

    # The value a _Checked option converts to depends on its check (a float, an int, or "auto").
    # ParamType is generic in click's recent type information only: pyproject allows click >= 8.1.
    _ParamType = click.ParamType[Any]
else:
    _ParamType = click.ParamType

__all__ = ["Group", "POSITIVE", "PROBABILITY", "OPEN_UNIT", "POSITIVE_INT", "DATASET_SIZE", "BATCH_SIZE", "EPOCHS",
           "UNIT_CAP", "LEARNING_RATE", "LEARNING_RATE_OR_AUTO", "THREADS_OR_AUTO", "bounded_int",
           "bounded_non_negative", "emit_json", "warn", "console"]


class Group(click.Group):
    """A click group whose ``main`` maps every expected error to one line and an exit code.

    SIGTERM is turned into an exception for the duration, as Ctrl-C already is, so that a
    terminated command unwinds: temporary files are removed, locks released, nothing is
    left half-written.
    """

    @overload
    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: Literal[True] = True, **extra: Any) -> NoReturn: ...

    @overload
    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = ..., **extra: Any) -> int: ...

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> int:
        previous = _catch_sigterm()
        try:
            rv = super().main(args=args, prog_name=prog_name, complete_var=complete_var,
                              standalone_mode=False, **extra)
        except click.exceptions.Exit as exc:
            code = exc.exit_code
        except click.exceptions.NoArgsIsHelpError as exc:
            click.echo(exc.ctx.get_help())
            click.echo(f"error: {exc.ctx.command_path} needs a command (listed above)", err=True)
            code = exc.exit_code
        except click.exceptions.Abort as exc:
            terminated = isinstance(exc.__cause__, Terminated)
            click.echo("error: terminated (SIGTERM)" if terminated else "error: aborted", err=True)
            code = 1
        except click.ClickException as exc:
            click.echo(f"error: {_one_line(exc.format_message())}", err=True)
            code = exc.exit_code
        except BudgetplanError as exc:
            click.echo(f"error: {_one_line(str(exc))}", err=True)
            code = exc.exit_code
        except BrokenPipeError:
            code = 0
        except OSError as exc:
            # The operating system refused something no check above foresaw; say what and where.
            where = f"{exc.filename}: " if exc.filename else ""
            click.echo(f"error: {where}{_one_line(exc.strerror or str(exc))}", err=True)
            code = 1
        else:
            code = rv if isinstance(rv, int) else 0
        finally:
            _restore_sigterm(previous)
        if standalone_mode:
            sys.exit(code)
        return code


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the program is, so that it unwinds like Ctrl-C."""


def _raise_terminated(signum: int, frame: FrameType | None) -> NoReturn:
    raise Terminated()


def _catch_sigterm() -> signal.Handlers | Callable[[int, FrameType | None], Any] | int | None:
    try:
        return signal.signal(signal.SIGTERM, _raise_terminated)
    except ValueError:  # not the main thread: signals stay with whoever owns them
        return None


def _restore_sigterm(previous: signal.Handlers | Callable[[int, FrameType | None], Any] | int | None) -> None:
    if previous is not None:
        signal.signal(signal.SIGTERM, previous)


def _one_line(message: str) -> str:
    return " ".join(message.split())


class _Checked(_ParamType):
    """A float or int option checked by a ``_validate`` function, named as the option."""

    def __init__(self, name: str, check: Callable[[str, Any], Any], base: type = float) -> None:
        self.name = name
        self._check = check
        self._base = base

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        long = [o for o in getattr(param, "opts", ()) if o.startswith("--")]
        label = long[0] if long else (f"--{param.name.replace('_', '-')}" if param is not None else "value")
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            raw = value
        else:
            try:
                raw = float(str(value).strip())
            except ValueError:
                self.fail(f"{label} must be a number, got {value!r}", param, ctx)
        try:
            return self._check(label, raw)
        except InvalidParameterError as exc:
            self.fail(str(exc), param, ctx)

    def fail(self, message: str, param: click.Parameter | None = None, ctx: click.Context | None = None) -> NoReturn:
        raise click.UsageError(message, ctx)


POSITIVE = _Checked("positive", validate.positive)
PROBABILITY = _Checked("probability", lambda n, v: validate.probability(n, v, allow_zero=True))
OPEN_UNIT = _Checked("open_unit", validate.open_unit)
POSITIVE_INT = _Checked("positive_int", validate.positive_int)


def _bounded(check: Callable[[str, object], float], limit: float) -> Callable[[str, object], float]:
    return lambda name, value: validate.at_most(name, check(name, value), limit)


def bounded_int(name: str, limit: int) -> _Checked:
    """An integer in [1, limit], ``limit`` one of ``budgetplan.limits``."""
    return _Checked(name, _bounded(validate.positive_int, limit))


def bounded_non_negative(name: str, limit: float) -> _Checked:
    """A finite number in [0, limit], ``limit`` one of ``budgetplan.limits``."""
    return _Checked(name, _bounded(validate.non_negative, limit))


DATASET_SIZE = bounded_int("dataset_size", limits.MAX_DATASET_SIZE)
BATCH_SIZE = bounded_int("batch_size", limits.MAX_DATASET_SIZE)  # a batch is never larger than the data
UNIT_CAP = bounded_int("unit_cap", limits.MAX_UNIT_CAP)
EPOCHS = _Checked("epochs", _bounded(validate.positive, limits.MAX_EPOCHS))
LEARNING_RATE = _Checked("learning_rate", _bounded(validate.positive, limits.MAX_LEARNING_RATE))


class _OrAuto(_Checked):
    """``"auto"``, or what the wrapped check accepts."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        return "auto" if value == "auto" else super().convert(value, param, ctx)


class _OrNone(_Checked):
    """``"none"`` (returned as the string), or what the wrapped check accepts."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        return "none" if value == "none" else super().convert(value, param, ctx)


# A number of epochs, or "none" (the RR phase's weight average: TrainSettings.rr_average)
EPOCHS_OR_NONE = _OrNone("epochs", _bounded(validate.positive, limits.MAX_EPOCHS))

# The DP-SGD phase's step size: a learning rate, or "auto" (trainers.dpsgd: 0.12 / sqrt(steps))
LEARNING_RATE_OR_AUTO = _OrAuto("learning_rate_or_auto", _bounded(validate.positive, limits.MAX_LEARNING_RATE))

# CPU threads or worker processes: a count up to MAX_THREADS, or "auto" (the free CPUs)
THREADS_OR_AUTO = _OrAuto("threads_or_auto", _bounded(validate.positive_int, limits.MAX_THREADS))


def _clean(value: object) -> object:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def emit_json(payload: Mapping[str, Any]) -> None:
    """One JSON object, alone on stdout; non-finite floats become null."""
    click.echo(json.dumps(_clean(payload), indent=2, allow_nan=False))


def warn(message: str) -> None:
    click.echo(f"warning: {message}", err=True)


def console() -> Console:
    from rich.console import Console

    return Console(highlight=False)
