"""The CLI's error boundary: SIGTERM unwinds like Ctrl-C, and its handler is put back."""

import signal

from budgetplan.cli import cli
from budgetplan.cli.shell import Terminated


def test_sigterm_is_taken_over_only_while_a_command_runs(runner, monkeypatch):
    def outer(signum, frame):
        pass

    during = []

    def rule_parser(*args, **kwargs):  # runs inside the command: see whose handler is in place, then "receive" it
        during.append(signal.getsignal(signal.SIGTERM))
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, outer)
    try:
        monkeypatch.setattr("budgetplan.scenario.split_rules.parse_rule", rule_parser)
        out = runner.invoke(cli, ["split", "--epsilon", "8", "--delta", "1e-6", "--dataset-size", "100",
                                  "--batch-size", "10", "--steps", "1", "--rule", "alpha=0.5"])
        assert out.exit_code == 1 and out.stderr.strip().splitlines()[-1] == "error: terminated (SIGTERM)"
        assert during and during[0] is not outer
        assert signal.getsignal(signal.SIGTERM) is outer
    finally:
        signal.signal(signal.SIGTERM, previous)
