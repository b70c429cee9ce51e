"""Every command that writes, to every kind of bad destination, and interrupted mid-write.

Destinations: a read-only directory, a directory without access, a name longer than the
file system allows, a missing parent, an existing directory, an empty name; faults: a
full disk at commit or at creation, SIGTERM and Ctrl-C mid-write. An existing file at the
destination must survive every failure unchanged (the snapshot compares its bytes).
"""

from __future__ import annotations

from tests.fuzz.artefacts import SMALL_SCENARIOS
from tests.fuzz.harness import Artefact, Case, Dir, Text

__all__ = ["output_cases"]

_RUN = Artefact("run", "run-rr")
_BASE = Artefact("base", "run-baseline")
_TRAIN = (Artefact("plan.json", "plan-train"), Artefact("train.parquet", "train-parquet"))

# (name, argv with OUT for the destination, inputs, suffix of a file destination)
FILE_WRITERS = (
    ("plan", ("plan", "s.toml", "-o", "OUT"), (Text("s.toml", SMALL_SCENARIOS["rr"]),), ".json"),
    ("statement", ("statement", "plan.json", "-o", "OUT"), (Artefact("plan.json", "plan-rr-impression"),), ".txt"),
    ("run-statement", ("statement", "run", "-o", "OUT"), (_RUN,), ".txt"),
    ("synth", ("data", "synth", "--rows", "50", "--users", "5", "--out", "OUT"), (), ".parquet"),
    ("synth-csv", ("data", "synth", "--rows", "50", "--users", "5", "--out", "OUT"), (), ".csv"),
    ("curve", ("plot", "curve", "--noise-multiplier", "1", "--dataset-size", "1000", "--batch-size", "10",
               "--max-epochs", "1", "--points", "2", "--delta", "1e-6", "--accountant", "rdp", "-o", "OUT"), (),
     ".png"),
    ("frontier", ("plot", "frontier", "run", "--baseline", "base/run.json", "-o", "OUT"), (_RUN, _BASE), ".png"),
)

# (name, destination relative to OUT's directory, extra inputs, root_ok)
BAD_FILE_DESTINATIONS = (
    ("read-only-dir", "ro/out", (Dir("ro", 0o555),), True),
    ("closed-dir", "closed/out", (Dir("closed", 0o000),), True),
    ("name-too-long", "o" * 300, (), True),
    ("missing-parent", "nope/out", (), True),
    ("is-directory", "d", (Dir("d"),), True),
    ("empty", "", (), True),
    ("parent-is-file", "f/out", (Text("f", "a file"),), True),
)

FAULTS = ("enospc", "enospc-create", "sigterm", "interrupt")


def _argv(argv: tuple, out: str) -> tuple:
    return tuple(out if a == "OUT" else a for a in argv)


def _file_cases() -> list[Case]:
    cases = []
    for name, argv, inputs, suffix in FILE_WRITERS:
        for dest, rel, extra, root_ok in BAD_FILE_DESTINATIONS:
            out = rel + suffix if rel and dest not in ("is-directory", "name-too-long") else rel
            if dest == "is-directory":
                extra = (Dir(rel),)
            cases.append(Case(id=f"out-{name}-{dest}", argv=_argv(argv, out), expect="reject",
                              inputs=inputs + extra, root_ok=root_ok))
        for fault in FAULTS:
            # an existing file at the destination: it must survive the failure byte for byte
            cases.append(Case(id=f"out-{name}-{fault}", argv=_argv(argv, "out" + suffix), expect="reject",
                              inputs=inputs + (Text("out" + suffix, "the previous version\n"),), fault=fault))
        long_ok = "n" * (255 - len(suffix)) + suffix  # the longest name allowed: its temporary name must fit too
        cases.append(Case(id=f"out-{name}-longest-name", argv=_argv(argv, long_ok), expect="accept",
                          inputs=inputs, outputs=(long_ok,)))
        cases.append(Case(id=f"out-{name}-replaces", argv=_argv(argv, "out" + suffix), expect="accept",
                          inputs=inputs + (Text("out" + suffix, "the previous version\n"),), outputs=("out" + suffix,)))
    cases.append(Case("out-curve-not-png", _argv(FILE_WRITERS[5][1], "curve.jpg"), "reject"))
    # a device is written through, never replaced by a plain file (util/fileio; /dev/full: tests/test_files.py)
    for name, argv, inputs, _ in FILE_WRITERS[:3]:
        cases.append(Case(f"out-{name}-dev-null", _argv(argv, "/dev/null"), "accept", inputs=inputs))
    # a name ending in / is a directory (it once wrote a file named "newdir"); synth writes shards there
    for name, argv, inputs, _ in FILE_WRITERS:
        if not name.startswith("synth"):
            cases.append(Case(f"out-{name}-trailing-slash", _argv(argv, "newdir/"), "reject", inputs=inputs))
    cases.append(Case("out-plan-unicode-name", ("plan", "s.toml", "-o", "plän ✓.json"), "accept",
                      inputs=(Text("s.toml", SMALL_SCENARIOS["rr"]),), outputs=("plän ✓.json",)))
    return cases


_TRAIN_ARGV = ("train", "plan.json", "--data", "train.parquet", "--out", "OUT", "--embedding-dim", "1")
_DEMO_ARGV = ("demo", "--rows", "2000", "--users", "400", "--epsilon", "1", "--out", "OUT")


def _run_directory_cases() -> list[Case]:
    cases = []
    for name, argv, inputs in (("train", _TRAIN_ARGV, _TRAIN), ("demo", _DEMO_ARGV, ())):
        for dest, rel, extra, root_ok in BAD_FILE_DESTINATIONS:
            if dest == "is-directory":
                continue  # an existing (empty) directory is a fine place for a run
            out = "f" if dest == "parent-is-file" else rel
            if dest == "parent-is-file":
                extra = (Text("f", "a file"),)
            # a run directory is created with its parents, as `mkdir -p` would
            expect = "accept" if dest == "missing-parent" else "reject"
            cases.append(Case(id=f"out-{name}-{dest}", argv=_argv(argv, out), expect=expect, inputs=inputs + extra,
                              root_ok=root_ok, outputs=("nope",) if expect == "accept" else ()))
        cases.append(Case(id=f"out-{name}-nested-read-only", argv=_argv(argv, "ro/a/b"), expect="reject",
                          inputs=inputs + (Dir("ro", 0o555),)))
        cases.append(Case(id=f"out-{name}-component-too-long", argv=_argv(argv, "a/" + "b" * 300 + "/c"),
                          expect="reject", inputs=inputs))
        for fault in ("enospc", "enospc-create", "sigterm", "interrupt"):
            cases.append(Case(id=f"out-{name}-{fault}", argv=_argv(argv, "run"), expect="reject", inputs=inputs,
                              fault=fault))
    cases += [
        Case("out-train-existing-record", _argv(_TRAIN_ARGV, "run"), "reject", inputs=_TRAIN + (_RUN,)),
        Case("out-train-interrupted-run", _argv(_TRAIN_ARGV, "run"), "reject",
             inputs=_TRAIN + (Artefact("run", "run-rr", ("run.json", lambda b: None)),)),
        # a new run in a directory of other files: refused (a failed run may empty its directory)
        Case("out-train-not-empty", _argv(_TRAIN_ARGV, "d"), "reject", inputs=_TRAIN + (Text("d/keep.txt", "mine"),)),
        Case("out-train-not-empty-resume", _argv(_TRAIN_ARGV, "d") + ("--resume",), "reject",
             inputs=_TRAIN + (Text("d/keep.txt", "mine"),)),
        Case("out-train-resume-nothing", _argv(_TRAIN_ARGV, "new") + ("--resume",), "reject", inputs=_TRAIN),
        Case("out-train-empty-dir-ok", _argv(_TRAIN_ARGV, "d") + ("--json",), "accept", inputs=_TRAIN + (Dir("d"),),
             outputs=("d",)),
        Case("out-train-nested-new", _argv(_TRAIN_ARGV, "a/b/c") + ("--json",), "accept", inputs=_TRAIN,
             outputs=("a",)),
        Case("out-train-stale-temporary-removed", _argv(_TRAIN_ARGV, "d") + ("--json",), "accept",
             inputs=_TRAIN + (Text("d/.model.pt.0123456789abcdef.tmp", "half a model"),), outputs=("d",)),
        # "" was the current directory (a Path of "" is ".")
        Case("out-data-cap-empty", ("data", "cap", "t.parquet", "--unit-id", "user_id", "--unit-cap", "2",
                                    "--new-key", "k.key", "--out", ""), "reject",
             inputs=(Artefact("t.parquet", "train-parquet"),)),
        Case("out-data-split-empty", ("data", "split", "t.parquet", "--unit-id", "user_id", "--held-out", "0.3",
                                      "--new-key", "k.key", "--out", ""), "reject",
             inputs=(Artefact("t.parquet", "train-parquet"),)),
        Case("out-demo-not-empty", _argv(_DEMO_ARGV, "d"), "reject", inputs=(Text("d/keep.txt", "mine"),)),
        Case("out-demo-users-above-rows", ("demo", "--rows", "10", "--users", "20", "--out", "d"), "reject"),
    ]
    # killed after privacy was spent: the run directory is evidence (ledger, labels), never a result
    for fault in ("sigterm@model.pt", "interrupt@model.pt", "enospc@model.pt", "sigterm@run.json",
                  "enospc@run.json", "sigterm@rr_labels.npy"):
        cases.append(Case(id=f"out-train-{fault.replace('@', '-at-')}", argv=_argv(_TRAIN_ARGV, "run"),
                          expect="interrupted", inputs=_TRAIN, fault=fault))
    # a clean failure to save the first release: the draw never left the process, nothing was
    # spent, and the run leaves nothing (no plan.json, no one-intent ledger, no .lock)
    cases.append(Case("out-train-enospc-at-rr_labels.npy", _argv(_TRAIN_ARGV, "run"), "reject", inputs=_TRAIN,
                      fault="enospc@rr_labels.npy"))
    cases.append(Case("out-train-enospc-at-rr_labels.npy-empty-dir", _argv(_TRAIN_ARGV, "d"), "reject",
                      inputs=_TRAIN + (Dir("d"),), fault="enospc@rr_labels.npy"))
    for fault in ("sigterm@checkpoint.pt", "enospc@checkpoint.pt"):
        cases.append(Case(id=f"out-train-dpsgd-{fault.replace('@', '-at-')}", expect="interrupted", fault=fault,
                          argv=_argv(_TRAIN_ARGV, "run") + ("--checkpoint-every", "1"),
                          inputs=(Artefact("plan.json", "plan-train-dpsgd"),
                                  Artefact("train.parquet", "train-parquet"))))
    return cases


def output_cases() -> list[Case]:
    return _file_cases() + _run_directory_cases()
