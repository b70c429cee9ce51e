"""Every code example in README.md and docs/ runs as written.

Each page is one session in an empty directory, its fenced blocks taken in order:

- ```` ```python ````: executed, one namespace per page;
- ```` ```sh ````: every command (``\\``-continued lines joined, ``#`` comments dropped) must start
  with ``budgetplan`` and exit 0 through click's CliRunner; ``> FILE`` writes its stdout to FILE;
- ```` ```text ```` right after a command block: an excerpt of what those commands print; each of
  its lines must appear in their output (runs of spaces compared as one), so quoted numbers cannot
  drift from what the commands say;
- ```` ```toml ````: must parse; with ``title="NAME"`` it is written to NAME for later blocks.

A block that must not run says so on the line before it, ``<!-- not-run: reason -->``, where the
reader sees it; the test keeps that list short. Any other fence (no language, another language)
fails: a new kind of example needs a rule here.
"""

from __future__ import annotations

import json
import re
import shlex
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from budgetplan.cli import cli

pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[2]
PAGES = ["README.md", *sorted(p.relative_to(REPO).as_posix() for p in (REPO / "docs").rglob("*.md"))]
MAX_NOT_RUN = 6  # the install commands (CI runs them itself), a cluster, a Spark master

FENCE = re.compile(r"^(?P<indent>[ ]*)(?P<fence>```+)(?P<info>[^\n`]*)\n(?P<body>.*?)^(?P=indent)(?P=fence)[ ]*$",
                   re.M | re.S)
NOT_RUN = re.compile(r"<!--\s*not-run:\s*(?P<reason>.*?)\s*-->\s*$")
TITLE = re.compile(r'title="(?P<name>[^"]+)"')


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    lang: str
    info: str
    body: str
    not_run: str | None  # the reason, when the page marks the block as not run
    after_block: bool  # only whitespace between this block and the previous one

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def blocks(page: str) -> list[Block]:
    text = (REPO / page).read_text(encoding="utf-8")
    found: list[Block] = []
    end = 0
    for m in FENCE.finditer(text):
        before = text[:m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = NOT_RUN.search(before)
        indent = len(m["indent"])
        body = "\n".join(line[indent:] for line in m["body"].splitlines())
        info = m["info"].strip()
        found.append(Block(page, text.count("\n", 0, m.start()) + 1, info.split(" ")[0] if info else "", info,
                           body, marker["reason"] if marker else None,
                           bool(found) and not text[end:m.start()].strip()))
        end = m.end()
    return found


def commands(body: str) -> list[list[str]]:
    """The block's commands: continued lines joined, comments and blank lines dropped."""
    out = []
    for line in body.replace("\\\n", " ").splitlines():
        args = shlex.split(line, comments=True)
        if args:
            out.append(args)
    return out


def squash(text: str) -> str:
    return re.sub(r"[ \t]+", " ", text)


def check_excerpt(excerpt: str, output: str, where: str) -> None:
    """Each line of the excerpt is somewhere in the output (runs of spaces compared as one)."""
    printed = squash(output)
    missing = [line for line in excerpt.splitlines() if line.strip() and squash(line.strip()) not in printed]
    assert not missing, f"{where}: not in the commands' output: {missing}\n--- output ---\n{output}"


def run_page(page: str, runner: CliRunner) -> None:
    namespace: dict = {"__name__": "__docs__"}
    output = None  # what the last command block printed, for a ```text excerpt right after it
    for block in blocks(page):
        if block.not_run is not None:
            output = None
            continue
        if block.lang == "python":
            exec(compile(block.body, block.where, "exec"), namespace)  # noqa: S102
            output = None
        elif block.lang == "sh":
            output = ""
            for args in commands(block.body):
                assert args[0] == "budgetplan", f"{block.where}: not a budgetplan command: {shlex.join(args)}"
                target = None
                if len(args) > 2 and args[-2] == ">":
                    args, target = args[:-2], args[-1]
                result = runner.invoke(cli, args[1:])
                assert result.exit_code == 0, f"{block.where}: {shlex.join(args)} exited {result.exit_code}:\n" \
                                              f"{result.output}"
                if target is not None:
                    Path(target).write_text(result.stdout, encoding="utf-8")
                output += result.output
        elif block.lang == "text":
            if block.after_block and output is not None:
                check_excerpt(block.body, output, block.where)
            output = None
        elif block.lang == "toml":
            tomllib.loads(block.body)
            title = TITLE.search(block.info)
            if title:
                Path(title["name"]).write_text(block.body + "\n", encoding="utf-8")
            output = None
        else:
            pytest.fail(f"{block.where}: a ```{block.lang} block: say what it is (python, sh, text, toml) "
                        f"or mark it <!-- not-run: reason -->")


def check_plan_then_train(root: Path) -> None:
    """docs/guide/train.md, "Plan, then train": the run it makes is the one the page describes."""
    record = json.loads((root / "runs" / "hybrid" / "run.json").read_text())
    assert record["algorithm"] == "hybrid"
    assert [p["name"] for p in record["phases"]] == ["rr", "dpsgd", "calibration"]
    assert record["phases"][1]["steps_executed"] == record["phases"][1]["steps_planned"]
    assert "metrics" not in record  # metrics on private labels stay with the data owner
    metrics = json.loads((root / "runs" / "hybrid" / "private" / "record.json").read_text())["metrics"]["eval"]
    # a private model that has learnt something, compared against the baseline the page trains
    assert metrics["auc"] > 0.6 and metrics["relative_auc_loss"] is not None
    # the intercept calibration brings the mean prediction to the base rate (about 0.7 without it)
    assert abs(metrics["calibration_ratio"] - 1) < 0.1, metrics["calibration_ratio"]


AFTER = {"docs/guide/train.md": check_plan_then_train}


@pytest.mark.parametrize("page", PAGES)
def test_examples_run(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run_page(page, CliRunner())
    if page in AFTER:
        AFTER[page](tmp_path)


def test_few_blocks_are_not_run_and_each_says_why():
    skipped = [b for page in PAGES for b in blocks(page) if b.not_run is not None]
    assert all(b.not_run for b in skipped), [b.where for b in skipped if not b.not_run]
    assert len(skipped) <= MAX_NOT_RUN, [(b.where, b.not_run) for b in skipped]


def test_the_readme_gives_the_two_commands_ci_runs():
    readme = [b for b in blocks("README.md") if b.not_run is not None]
    install_and_demo, tests = (b.body.strip() for b in readme)
    assert install_and_demo == 'python -m pip install -e ".[train]" && budgetplan demo'
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8").replace(" --quiet", "")  # CI's pip is quiet
    assert tests in ci.splitlines()


def test_the_pages_hold_runnable_examples():
    kinds = {(b.page, b.lang) for page in PAGES for b in blocks(page) if b.not_run is None}
    assert ("README.md", "sh") in kinds and ("README.md", "text") in kinds
    assert ("docs/guide/train.md", "sh") in kinds and ("docs/guide/python-api.md", "python") in kinds


def test_an_excerpt_that_was_not_printed_fails():
    check_excerpt("noise multiplier  0.7\n", "noise multiplier 0.7 \nsteps 250\n", "here")
    with pytest.raises(AssertionError, match="0.8"):
        check_excerpt("noise multiplier 0.8\n", "noise multiplier 0.7\n", "here")
