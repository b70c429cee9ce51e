"""The ``budgetplan`` command line: a thin shell over the Python API.

Commands import their heavy dependencies lazily, so ``budgetplan --help`` stays fast and
never imports torch or pyarrow.
"""

from __future__ import annotations

from collections.abc import Sequence

import click

from budgetplan.cli.data_cmd import data
from budgetplan.cli.dpsgd_cmd import dpsgd
from budgetplan.cli.export_cmd import export
from budgetplan.cli.plan_cmds import audit, examples, plan, show, statement, verify
from budgetplan.cli.plot_cmds import plot
from budgetplan.cli.release_cmds import gaussian, group, rr
from budgetplan.cli.shell import Group
from budgetplan.cli.split_cmd import split
from budgetplan.cli.train_cmds import demo, train
from budgetplan.version import __version__

__all__ = ["cli", "main"]


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="budgetplan")
def cli() -> None:
    """Plan, execute and audit differential-privacy budgets for ads models."""


cli.add_command(rr)
cli.add_command(gaussian)
cli.add_command(dpsgd)
cli.add_command(group)
cli.add_command(split)
cli.add_command(plan)
cli.add_command(show)
cli.add_command(verify)
cli.add_command(statement)
cli.add_command(export)
cli.add_command(examples)
cli.add_command(data)
cli.add_command(train)
cli.add_command(demo)
cli.add_command(audit)
cli.add_command(plot)


def main(argv: Sequence[str] | None = None) -> int:
    """Console-script entry point."""
    return cli.main(args=argv, prog_name="budgetplan")
