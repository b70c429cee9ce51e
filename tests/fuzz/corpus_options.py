"""Generated cases: every command x every numeric option x a fixed set of bad or extreme values.

Each option is tried with every value in ``VALUES`` on top of a valid, cheap base command.
An ``Opt`` names the values that are valid for it (``accept``) and those that may be either
answered or refused (``either``: extreme but valid, where a clean refusal naming a limit is as
good as an answer); every other value must be refused.
"""

from __future__ import annotations

from dataclasses import dataclass

from tests.fuzz.harness import Artefact, Case

__all__ = ["VALUES", "option_cases"]


VALUES = {
    "nan": "nan",
    "inf": "inf",
    "-inf": "-inf",
    "neg": "-1",
    "zero": "0",
    "big": "1e308",
    "tiny": "1e-300",
    "huge": "1" + "0" * 30,
    "2^63": str(2**63),
    "word": "abc",
    "empty": "",
    "frac": "2.5",
}


@dataclass(frozen=True)
class Opt:
    """One option of one command.

    Attributes:
        name: the option, e.g. ``--epsilon``.
        accept: the names of the values (keys of ``VALUES``) that are valid here.
        either: the values that must end ``clean``: a complete answer or a clean, one-line
            refusal (the engine's call, e.g. a grid it coarsens or a limit it names).
        base: the command to add the option to (default: the command's base); when the
            base already holds the option, its value is replaced.
        inputs: the files that base needs (default: the command's).
        skip: valid values whose run costs seconds (a demo, a long training): left out of
            the corpus, and named here so that the omission is visible.
    """

    name: str
    accept: str = ""
    either: str = ""
    base: tuple | None = None
    inputs: tuple | None = None
    skip: str = ""


@dataclass(frozen=True)
class Cmd:
    key: str
    base: tuple
    options: tuple
    inputs: tuple = ()
    outputs: tuple = ()


_PLAN_TRAIN = Artefact("plan.json", "plan-train")
_DPSGD_TRAIN = (Artefact("plan.json", "plan-train-dpsgd"), Artefact("train.parquet", "train-parquet"))
_TRAIN_DATA = Artefact("train.parquet", "train-parquet")
_NON_PRIVATE = ("train", "plan.json", "--data", "train.parquet", "--out", "run", "--non-private", "--embedding-dim",
                "1", "--baseline-epochs", "2", "--json")

COMMANDS = (
    Cmd("rr", ("rr", "--epsilon", "1", "--json"), (
        Opt("--epsilon", accept="tiny frac"),
        Opt("--flip-probability", accept="tiny", base=("rr", "--flip-probability", "0.1", "--json")),
        Opt("--unit-cap", accept=""),
        Opt("--delta", accept="zero tiny", base=("rr", "--epsilon", "1", "--unit-cap", "3", "--json")),
    )),
    Cmd("gaussian", ("gaussian", "--epsilon", "1", "--delta", "1e-6", "--sensitivity", "1", "--json"), (
        Opt("--epsilon", accept="frac tiny huge 2^63", either="big"),
        Opt("--noise-std", accept="frac big huge 2^63", either="tiny",
            base=("gaussian", "--noise-std", "3", "--delta", "1e-6", "--sensitivity", "1", "--json")),
        Opt("--delta", accept="tiny"),
        Opt("--sensitivity", accept="frac tiny huge 2^63", either="big"),
        Opt("--unit-cap", accept=""),
    )),
    Cmd("dpsgd", ("dpsgd", "--noise-multiplier", "1", "--delta", "1e-6", "--dataset-size", "10000",
                  "--batch-size", "100", "--steps", "10", "--accountant", "rdp", "--json"), (
        Opt("--noise-multiplier", accept="frac huge 2^63"),  # 1e308: RDP overflows, a clean error
        Opt("--epsilon", accept="frac",  # calibration targets above epsilon 100 are refused (limits.py)
            base=("dpsgd", "--epsilon", "1", "--delta", "1e-6", "--dataset-size", "10000", "--batch-size", "100",
                  "--steps", "10", "--accountant", "rdp", "--json")),
        Opt("--delta", accept="tiny"),
        Opt("--dataset-size", accept=""),
        Opt("--batch-size", accept=""),
        Opt("--epochs", accept="tiny frac",
            base=("dpsgd", "--noise-multiplier", "1", "--delta", "1e-6", "--dataset-size", "10000",
                  "--batch-size", "100", "--epochs", "1", "--accountant", "rdp", "--json")),
        Opt("--steps", accept="", either=""),
        Opt("--max-batch-size", accept="",
            base=("dpsgd", "--noise-multiplier", "1", "--delta", "1e-6", "--dataset-size", "10000",
                  "--batch-size", "100", "--steps", "10", "--accountant", "pld", "--discretization", "1e-2",
                  "--json")),
        Opt("--unit-cap", accept="", either=""),
        Opt("--discretization", accept="frac", either="tiny",
            base=("dpsgd", "--noise-multiplier", "1", "--delta", "1e-6", "--dataset-size", "10000",
                  "--batch-size", "100", "--steps", "10", "--accountant", "pld", "--json")),
    )),
    Cmd("group", ("group", "--epsilon", "1", "--delta", "1e-6", "--group-size", "10", "--json"), (
        Opt("--epsilon", accept="frac tiny big huge 2^63"),  # a vacuous bound, reported as one
        Opt("--delta", accept="zero tiny"),
        Opt("--group-size", accept=""),
    )),
    Cmd("split", ("split", "--epsilon", "8", "--delta", "1e-6", "--dataset-size", "10000", "--batch-size", "100",
                  "--steps", "10", "--json"), (
        Opt("--epsilon", accept="frac", either="big huge 2^63"),
        Opt("--delta", accept=""),  # 1e-300: infeasible, no noise multiplier up to 1e4 meets it
        Opt("--dataset-size", accept=""),
        Opt("--batch-size", accept=""),
        Opt("--epochs", accept="tiny frac",
            base=("split", "--epsilon", "8", "--delta", "1e-6", "--dataset-size", "10000", "--batch-size", "100",
                  "--epochs", "1", "--json")),
        Opt("--steps", accept="", either=""),
        Opt("--jobs", accept=""),
    )),
    Cmd("plot-curve", ("plot", "curve", "--noise-multiplier", "1", "--dataset-size", "1000", "--batch-size", "10",
                       "--max-epochs", "1", "--points", "2", "--delta", "1e-6", "--accountant", "rdp", "-o",
                       "curve.png"), (
        Opt("--noise-multiplier", accept="frac huge 2^63"),  # 1e308: RDP overflows, a clean error
        Opt("--dataset-size", accept=""),
        Opt("--batch-size", accept=""),
        Opt("--max-epochs", accept="tiny frac"),
        Opt("--points", accept=""),
        Opt("--delta", accept="tiny"),
    ), outputs=("curve.png",)),
    Cmd("data-synth", ("data", "synth", "--rows", "200", "--users", "20", "--out", "d.parquet", "--json"), (
        Opt("--rows", accept=""),
        Opt("--users", accept=""),
        Opt("--seed", accept="zero huge 2^63"),
        Opt("--shape", accept=""),  # a name from a fixed list: no number is one
    ), outputs=("d.parquet",)),
    # a Criteo-like shape (100k-value columns): the sizes are checked the same way
    Cmd("data-synth-shape", ("data", "synth", "--rows", "200", "--users", "20", "--shape", "sensitive", "--out",
                             "d.parquet", "--json"), (
        Opt("--rows", accept=""),
        Opt("--users", accept=""),
    ), outputs=("d.parquet",)),
    # the mixed family's knobs (the other shapes refuse them): shares and rates in their ranges, the
    # spreads positive up to their stated limits (5 and 4)
    Cmd("data-synth-mixed", ("data", "synth", "--rows", "200", "--users", "20", "--shape", "mixed", "--out",
                             "d.parquet", "--json"), (
        Opt("--nonsensitive-share", accept="zero tiny"),
        Opt("--cross-share", accept="zero tiny"),
        Opt("--signal-std", accept="tiny frac"),
        Opt("--base-rate", accept="tiny"),
        Opt("--user-sigma", accept="tiny frac"),
    ), outputs=("d.parquet",)),
    Cmd("data-count", ("data", "count", "train.parquet", "--unit-id", "user_id", "--unit-cap", "2", "--json"), (
        Opt("--unit-cap", accept=""),
        # below K / MAX_DATASET_SIZE the count is all noise (1e-300 divided by zero)
        Opt("--dp-epsilon", accept="frac big huge 2^63"),
    ), inputs=(_TRAIN_DATA,)),
    Cmd("data-cap", ("data", "cap", "train.parquet", "--unit-id", "user_id", "--unit-cap", "2", "--new-key", "k.key",
                     "--out", "capped", "--json"), (
        Opt("--unit-cap", accept=""),
    ), inputs=(_TRAIN_DATA,), outputs=("capped", "k.key")),
    Cmd("data-split", ("data", "split", "train.parquet", "--unit-id", "user_id", "--held-out", "0.3", "--new-key",
                       "k.key", "--out", "sets", "--json"), (
        Opt("--held-out", accept="", either="tiny"),  # a fraction no unit falls under: refused, nothing written
    ), inputs=(_TRAIN_DATA,), outputs=("sets", "k.key")),
    Cmd("data-synth-shards", ("data", "synth", "--rows", "200", "--users", "20", "--shape", "pctr", "--out", "d/",
                              "--json"), (
        Opt("--shard-rows", accept=""),
        Opt("--rows", accept=""),
    ), outputs=("d",)),
    # --embedding-dim 1: the hashed tables (2**16 rows) dominate a step's cost on this tiny data
    Cmd("train", ("train", "plan.json", "--data", "train.parquet", "--out", "run", "--embedding-dim", "1", "--json"), (
        Opt("--lr", accept="tiny frac"),
        Opt("--dpsgd-lr", accept="tiny frac", inputs=_DPSGD_TRAIN),
        Opt("--batch-size", accept="", base=("train", "plan.json", "--data", "train.parquet", "--out", "run",
                                             "--non-private", "--embedding-dim", "1", "--json")),
        Opt("--vocab-threshold", accept=""),
        Opt("--checkpoint-every", accept="big", skip="huge 2^63", inputs=_DPSGD_TRAIN),
        Opt("--seed", accept="zero huge 2^63"),
        Opt("--embedding-dim", accept=""),
        Opt("--hash-bins", accept=""),
        Opt("--threads", accept=""),
        Opt("--nproc", accept=""),
        *(Opt(name, accept=accept, base=_NON_PRIVATE) for name, accept in (
            ("--baseline-epochs", ""), ("--patience", ""), ("--validation-fraction", ""),
            ("--weight-decay", "zero tiny"))),
    ), inputs=(_PLAN_TRAIN, _TRAIN_DATA), outputs=("run",)),
    Cmd("demo", ("demo", "--rows", "2000", "--users", "400", "--epsilon", "1", "--out", "demo", "--json"), (
        Opt("--rows", accept=""),
        Opt("--users", accept=""),
        Opt("--epsilon", accept="frac", skip="big tiny huge 2^63"),
        Opt("--seed", accept="", skip="zero huge 2^63"),
        Opt("--threads", accept=""),
    ), outputs=("demo",)),
)

_INT_ONLY = {"frac"}


def _with(base: tuple, option: str, value: str) -> tuple:
    argv = list(base)
    if option in argv:
        argv[argv.index(option) + 1] = value
        return tuple(argv)
    # before a trailing flag such as --json, so that the value never looks like an option
    return tuple(argv[:-1] + [option, value, argv[-1]]) if argv[-1] == "--json" else tuple(argv + [option, value])


def option_cases() -> list[Case]:
    cases = []
    for cmd in COMMANDS:
        for opt in cmd.options:
            accept, skip = set(opt.accept.split()), set(opt.skip.split())
            either = {v: "clean" for v in opt.either.split()}
            unknown = (accept | set(either) | skip) - set(VALUES)
            if unknown:
                raise ValueError(f"{cmd.key} {opt.name}: unknown value names {sorted(unknown)}")
            for label, value in VALUES.items():
                if label in skip:
                    continue
                expect = "accept" if label in accept else either.get(label, "reject")
                cases.append(Case(
                    id=f"opt-{cmd.key}{opt.name}={label}",
                    argv=_with(opt.base or cmd.base, opt.name, value),
                    expect=expect,
                    inputs=cmd.inputs if opt.inputs is None else opt.inputs,
                    outputs=cmd.outputs if expect == "accept" else (),
                ))
    return cases
