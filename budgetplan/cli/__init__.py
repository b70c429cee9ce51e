"""The ``budgetplan`` command line: a thin shell over the Python API.

Commands import their heavy dependencies lazily, so ``budgetplan --help`` stays fast and
never imports torch or pyarrow.
"""

from __future__ import annotations

from collections.abc import Sequence
from importlib import import_module

import click

from budgetplan.cli.shell import Group
from budgetplan.version import __version__

__all__ = ["cli", "main"]

# Each command's module, imported when the command is looked up: ``budgetplan dpsgd`` loads the
# accounting commands only, not the data, training or plan commands (``--help`` lists them all).
_COMMANDS = {
    "rr": "release_cmds", "gaussian": "release_cmds", "dpsgd": "dpsgd_cmd", "group": "release_cmds",
    "split": "split_cmd", "plan": "plan_cmds", "show": "plan_cmds", "verify": "plan_cmds",
    "statement": "plan_cmds", "export": "export_cmd", "examples": "plan_cmds", "data": "data_cmd",
    "train": "train_cmds", "demo": "train_cmds", "audit": "plan_cmds", "plot": "plot_cmds",
}


class _Commands(Group):
    """The top-level group: every command of ``_COMMANDS``, listed by name, each imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(_COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in _COMMANDS:
            command = getattr(import_module(f"budgetplan.cli.{_COMMANDS[cmd_name]}"), cmd_name)
            self.add_command(command)
        return self.commands.get(cmd_name)


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="budgetplan")
def cli() -> None:
    """Plan, execute and audit differential-privacy budgets for ads models."""


def main(argv: Sequence[str] | None = None) -> int:
    """Console-script entry point."""
    return cli.main(args=argv, prog_name="budgetplan")
