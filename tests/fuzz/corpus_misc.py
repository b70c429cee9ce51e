"""Hand-written cases: the reviewer's findings one by one, and the combinations of options
that no single-option matrix reaches."""

from __future__ import annotations

from tests.fuzz.corpus_files import _at, _variant
from tests.fuzz.harness import Artefact, Case, Dir

__all__ = ["misc_cases"]

_DPSGD = ("dpsgd", "--noise-multiplier", "1", "--delta", "1e-6", "--dataset-size", "10000", "--batch-size", "256",
          "--steps", "10")
_SPLIT = ("split", "--delta", "1e-6", "--dataset-size", "10000", "--batch-size", "100", "--steps", "10")
_TRAIN = ("train", "plan.json", "--data", "train.parquet", "--out", "run", "--embedding-dim", "1")
_TRAIN_IN = (Artefact("plan.json", "plan-train"), Artefact("train.parquet", "train-parquet"))
_DPSGD_TRAIN_IN = (Artefact("plan.json", "plan-train-dpsgd"), Artefact("train.parquet", "train-parquet"))
_CURVE = ("plot", "curve", "--dataset-size", "1000", "--batch-size", "10", "--max-epochs", "1", "--points", "2",
          "--delta", "1e-6", "--accountant", "rdp", "-o", "c.png")

# (id, argv, expect, inputs, outputs, xfail)
CASES = (
    # the CLI applies the scenario's truncated-Poisson rule: B <= max_batch_size <= N
    ("dpsgd-max-batch-below-batch", _DPSGD + ("--max-batch-size", "100"), "reject"),
    ("dpsgd-max-batch-above-n", _DPSGD + ("--max-batch-size", "10001"), "reject"),
    ("dpsgd-max-batch-valid", _DPSGD + ("--max-batch-size", "400", "--discretization", "1e-2", "--json"), "accept"),
    ("dpsgd-max-batch-calibrate", ("dpsgd", "--epsilon", "1", "--delta", "1e-6", "--dataset-size", "10000",
                                   "--batch-size", "256", "--steps", "10", "--max-batch-size", "400"), "reject"),
    ("dpsgd-max-batch-solve-rows", ("dpsgd", "--epsilon", "1", "--noise-multiplier", "1", "--delta", "1e-6",
                                    "--batch-size", "256", "--epochs", "1", "--max-batch-size", "400"), "reject"),
    ("dpsgd-max-batch-solve-epochs", ("dpsgd", "--epsilon", "1", "--noise-multiplier", "1", "--delta", "1e-6",
                                      "--dataset-size", "10000", "--batch-size", "256", "--max-batch-size", "400"),
     "reject"),
    ("dpsgd-epochs-and-steps", _DPSGD + ("--epochs", "1"), "reject"),
    ("dpsgd-no-length", ("dpsgd", "--noise-multiplier", "1", "--delta", "1e-6", "--dataset-size", "10000",
                         "--batch-size", "256"), "reject"),
    ("dpsgd-batch-above-n", ("dpsgd", "--noise-multiplier", "1", "--delta", "1e-6", "--dataset-size", "100",
                             "--batch-size", "256", "--steps", "1"), "reject"),
    ("dpsgd-nothing-to-solve", ("dpsgd", "--delta", "1e-6", "--dataset-size", "100", "--batch-size", "10",
                                "--steps", "1"), "reject"),
    ("dpsgd-everything-given", _DPSGD + ("--epsilon", "3"), "reject"),
    ("dpsgd-delta-above-1/n-warns", ("dpsgd", "--noise-multiplier", "1", "--delta", "0.5", "--dataset-size", "100",
                                     "--batch-size", "10", "--steps", "1", "--accountant", "rdp", "--json"), "accept"),
    # calibration targets above limits.MAX_CALIBRATION_EPSILON: epsilon 1000 searched for 200 s
    ("dpsgd-calibrate-epsilon-1000", ("dpsgd", "--epsilon", "1000", "--delta", "1e-6", "--dataset-size", "10000",
                                      "--batch-size", "256", "--steps", "10"), "reject"),
    ("dpsgd-unit-cap-above-limit", _DPSGD + ("--unit-cap", "1000000"), "reject"),
    ("dpsgd-unit-cap-tight-truncated", _DPSGD + ("--unit-cap", "2", "--max-batch-size", "400"), "reject"),
    # the accounting engine's grid blow-ups: fixed on the accounting branch
    ("dpsgd-pld-sigma-1e-3", ("dpsgd", "--noise-multiplier", "1e-3", "--delta", "1e-6", "--dataset-size", "10000",
                              "--batch-size", "100", "--steps", "10"), "clean", (), ()),
    ("dpsgd-pld-unit-cap-1e5", _DPSGD + ("--unit-cap", "100000", "--accountant", "rdp", "--unit-accounting",
                                         "group"), "clean", (), ()),
    ("dpsgd-pld-unit-cap-1e4", _DPSGD + ("--unit-cap", "10000"), "clean", (), ()),
    ("dpsgd-pld-discretization-1e-12", _DPSGD + ("--discretization", "1e-12"), "clean", (), ()),
    # issue 26's inputs that ran past 60 s on a loaded machine; each within the bound stated in
    # docs/reference/cli.md (issue 27)
    ("dpsgd-pld-discretization-1e-300", _DPSGD + ("--discretization", "1e-300", "--json"), "clean", (), ()),
    ("dpsgd-pld-noise-0.01", ("dpsgd", "--noise-multiplier", "0.01") + _DPSGD[3:] + ("--json",), "clean", (), ()),
    ("dpsgd-pld-unit-cap-1e5-replace-one", _DPSGD + ("--unit-cap", "100000", "--adjacency", "replace-one"), "reject"),
    ("dpsgd-pld-steps-1e308", ("dpsgd", "--noise-multiplier", "1", "--delta", "1e-6", "--dataset-size", "10000",
                               "--batch-size", "100", "--steps", "1e308"), "reject", (), ()),
    ("rr-unit-cap-1e8", ("rr", "--epsilon", "1", "--unit-cap", "1e8"), "reject"),
    ("rr-unit-cap-limit-json", ("rr", "--epsilon", "1", "--unit-cap", "1000", "--json"), "accept"),
    ("rr-both-epsilon-flip", ("rr", "--epsilon", "1", "--flip-probability", "0.1"), "reject"),
    ("rr-neither", ("rr",), "reject"),
    ("rr-flip-half", ("rr", "--flip-probability", "0.5"), "reject"),
    ("rr-flip-with-cap", ("rr", "--flip-probability", "0.1", "--unit-cap", "3"), "reject"),
    ("rr-all-accountants-pure", ("rr", "--epsilon", "1", "--accountant", "all", "--json"), "accept"),
    ("rr-delta-one", ("rr", "--epsilon", "1", "--unit-cap", "3", "--delta", "1"), "reject"),
    ("gaussian-both", ("gaussian", "--epsilon", "1", "--noise-std", "1", "--delta", "1e-6", "--sensitivity", "1"),
     "reject"),
    ("gaussian-neither", ("gaussian", "--delta", "1e-6", "--sensitivity", "1"), "reject"),
    ("gaussian-noise-std-1e-300", ("gaussian", "--noise-std", "1e-300", "--delta", "1e-6", "--sensitivity", "1"),
     "clean", (), ()),
    # 1.25 / 5e-324 overflowed the classical guess; sensitivity / noise std underflowed to 0 (ZeroDivisionError)
    ("gaussian-delta-subnormal", ("gaussian", "--delta", "5e-324", "--epsilon", "1", "--sensitivity", "1", "--json"),
     "accept"),
    ("gaussian-ratio-underflows", ("gaussian", "--noise-std", "1e300", "--delta", "1e-300", "--sensitivity",
                                   "1e-300", "--accountant", "all", "--json"), "clean", (), ()),
    ("group-delta-one", ("group", "--epsilon", "1", "--delta", "1", "--group-size", "2"), "reject"),
    ("group-vacuous-human", ("group", "--epsilon", "50", "--delta", "1e-6", "--group-size", "100"), "accept"),
    # split rules are read strictly; eps1 = eps is the RR-only arm, spelled alpha=1
    ("split-rule-spaces", _SPLIT + ("--epsilon", "8", "--rule", "alpha = 0.5"), "reject"),
    ("split-rule-eps1-total", _SPLIT + ("--epsilon", "8", "--rule", "eps1=8"), "reject"),
    ("split-rule-eps1-above", _SPLIT + ("--epsilon", "8", "--rule", "eps1=9"), "reject"),
    ("split-rule-eps1-zero", _SPLIT + ("--epsilon", "8", "--rule", "eps1=0"), "reject"),
    ("split-rule-eps1-nan", _SPLIT + ("--epsilon", "8", "--rule", "eps1=nan"), "reject"),
    ("split-rule-alpha-inf", _SPLIT + ("--epsilon", "8", "--rule", "alpha=inf"), "reject"),
    ("split-rule-alpha-hex", _SPLIT + ("--epsilon", "8", "--rule", "alpha=0x1"), "reject"),
    ("split-rule-leading-space", _SPLIT + ("--epsilon", "8", "--rule", " paper-v1"), "reject"),
    ("split-rule-empty", _SPLIT + ("--epsilon", "8", "--rule", ""), "reject"),
    ("split-rule-alpha-one", _SPLIT + ("--epsilon", "8", "--rule", "alpha=1", "--json"), "accept"),
    ("split-rule-eps1-valid", _SPLIT + ("--epsilon", "8", "--rule", "eps1=2.5", "--json"), "accept"),
    ("split-grid-nan", _SPLIT + ("--rule", "grid", "--epsilons", "1,nan"), "reject"),
    ("split-grid-alpha-two", _SPLIT + ("--rule", "grid", "--epsilons", "1", "--alphas", "0.5,2"), "reject"),
    ("split-grid-empty-list", _SPLIT + ("--rule", "grid", "--epsilons", ""), "reject"),
    ("split-grid-trailing-comma", _SPLIT + ("--rule", "grid", "--epsilons", "1,"), "reject"),
    ("split-grid-too-large", _SPLIT + ("--rule", "grid", "--epsilons", ",".join(str(i) for i in range(1, 42))),
     "reject"),
    ("split-grid-alphas-without-grid", _SPLIT + ("--epsilon", "8", "--alphas", "0.5"), "reject"),
    ("split-no-epsilon", _SPLIT, "reject"),
    ("split-add-remove", _SPLIT + ("--epsilon", "8", "--adjacency", "add-remove"), "reject"),
    ("split-epochs-and-steps", _SPLIT + ("--epsilon", "8", "--epochs", "1"), "reject"),
    # plots
    ("curve-too-many-curves", ("plot", "curve") + tuple(a for i in range(51) for a in ("--noise-multiplier",
                                                                                         str(1 + i))) + _CURVE[2:],
     "reject"),
    ("curve-three-curves", ("plot", "curve", "--noise-multiplier", "1", "--noise-multiplier", "2",
                            "--noise-multiplier", "3") + _CURVE[2:], "accept", (), ("c.png",)),
    ("curve-points-limit", ("plot", "curve", "--noise-multiplier", "1") + _CURVE[2:] + ("--points", "1001"), "reject"),
    ("curve-batch-above-n", ("plot", "curve", "--noise-multiplier", "1", "--dataset-size", "10", "--batch-size",
                             "100", "--max-epochs", "1", "--delta", "1e-6", "-o", "c.png"), "reject"),
    ("curve-no-noise", _CURVE, "reject"),
    # the baseline is the non-private reference: never one of the runs, never a private run
    ("frontier-baseline-is-the-run", ("plot", "frontier", "run/run.json", "--baseline", "run/run.json", "-o",
                                      "f.png"), "reject", (Artefact("run", "run-rr"),)),
    ("frontier-baseline-is-private", ("plot", "frontier", "run", "--baseline", "run0/run.json", "-o", "f.png"),
     "reject", (Artefact("run", "run-rr"), Artefact("run0", "run-rr"))),
    # data synth
    ("synth-users-above-rows", ("data", "synth", "--rows", "5", "--users", "6", "--out", "d.parquet"), "reject"),
    ("synth-format-contradicts-name", ("data", "synth", "--rows", "50", "--users", "5", "--out", "d.parquet",
                                       "--format", "csv"), "reject"),
    ("synth-format-for-plain-name", ("data", "synth", "--rows", "50", "--users", "5", "--out", "d.bin",
                                     "--format", "csv"), "accept", (), ("d.bin",)),
    ("synth-seed-negative", ("data", "synth", "--rows", "50", "--users", "5", "--out", "d.parquet", "--seed", "-1"),
     "reject"),
    ("synth-rows-limit", ("data", "synth", "--rows", "100000001", "--users", "5", "--out", "d.parquet"), "reject"),
    ("synth-shape-csv", ("data", "synth", "--rows", "50", "--users", "5", "--shape", "balanced", "--out", "d.csv"),
     "accept", (), ("d.csv",)),
    ("synth-shape-unknown", ("data", "synth", "--rows", "50", "--users", "5", "--shape", "Balanced", "--out",
                             "d.parquet"), "reject"),
    # train: options the run would ignore, devices, the reviewer's eval-file findings
    ("train-device-tpu", _TRAIN + ("--device", "tpu"), "reject", _TRAIN_IN),
    ("train-device-empty", _TRAIN + ("--device", ""), "reject", _TRAIN_IN),
    ("train-device-upper", _TRAIN + ("--device", "CPU"), "reject", _TRAIN_IN),
    ("train-device-meta", _TRAIN + ("--device", "meta"), "reject", _TRAIN_IN),
    ("train-device-cuda-99", _TRAIN + ("--device", "cuda:99"), "reject", _TRAIN_IN),
    ("train-device-cpu", _TRAIN + ("--device", "cpu", "--json"), "accept", _TRAIN_IN, ("run",)),
    ("train-out-empty", ("train", "plan.json", "--data", "train.parquet", "--out", ""), "reject", _TRAIN_IN),
    ("train-out-whitespace", ("train", "plan.json", "--data", "train.parquet", "--out", " "), "reject", _TRAIN_IN),
    ("train-dpsgd-lr-on-rr-plan", _TRAIN + ("--dpsgd-lr", "0.1"), "reject", _TRAIN_IN),
    ("train-checkpoint-on-rr-plan", _TRAIN + ("--checkpoint-every", "5"), "reject", _TRAIN_IN),
    ("train-batch-size-fixed-by-plan", _TRAIN + ("--batch-size", "32"), "reject", _TRAIN_IN),
    ("train-loss-on-dpsgd-plan", _TRAIN + ("--loss", "forward"), "reject", _DPSGD_TRAIN_IN),
    ("train-hybrid-start-on-rr-plan", _TRAIN + ("--hybrid-start", "as-trained"), "reject", _TRAIN_IN),
    ("train-hybrid-start-on-dpsgd-plan", _TRAIN + ("--hybrid-start", "rr-model"), "reject", _DPSGD_TRAIN_IN),
    ("train-encoding-hash", _TRAIN + ("--encoding", "hash", "--json"), "accept", _TRAIN_IN, ("run",)),
    ("train-non-private-with-loss", _TRAIN + ("--non-private", "--loss", "forward"), "reject", _TRAIN_IN),
    ("train-non-private-with-resume", _TRAIN + ("--non-private", "--resume"), "reject", _TRAIN_IN),
    ("train-non-private-with-baseline", _TRAIN + ("--non-private", "--baseline", "base/run.json"), "reject",
     _TRAIN_IN + (Artefact("base", "run-baseline"),)),
    ("train-baseline-is-a-dp-run", _TRAIN + ("--baseline", "run0/run.json", "--json"), "reject",
     _TRAIN_IN + (Artefact("run0", "run-rr"),)),
    ("train-non-private", _TRAIN + ("--non-private", "--json"), "accept", _TRAIN_IN, ("run",)),
    ("train-non-private-truncated", _TRAIN + ("--non-private", "--truncated", "--baseline-epochs", "2", "--json"),
     "accept", _TRAIN_IN, ("run",)),
    ("train-patience-on-dp-run", _TRAIN + ("--patience", "3"), "reject", _TRAIN_IN),
    ("train-truncated-on-dp-run", _TRAIN + ("--truncated",), "reject", _TRAIN_IN),
    ("train-validation-fraction-above-half", _TRAIN + ("--non-private", "--validation-fraction", "0.6"), "reject",
     _TRAIN_IN),
    ("train-embedding-auto", ("train", "plan.json", "--data", "train.parquet", "--out", "run", "--embedding-dim",
                              "auto", "--json"), "accept", _TRAIN_IN, ("run",)),
    ("train-embedding-limit", _TRAIN[:-1] + ("1025",), "reject", _TRAIN_IN),
    ("train-embedding-spaces", _TRAIN[:-1] + (" 2 ", "--json"), "accept", _TRAIN_IN, ("run",)),
    ("train-embedding-float", _TRAIN[:-1] + ("1e3",), "reject", _TRAIN_IN),
    ("train-lr-limit", _TRAIN + ("--lr", "10.5"), "reject", _TRAIN_IN),
    ("train-lr-at-limit", _TRAIN + ("--lr", "10", "--json"), "accept", _TRAIN_IN, ("run",)),
    ("train-dpsgd-sgd-cosine", _TRAIN + ("--dpsgd-optimizer", "sgd", "--dpsgd-schedule", "cosine", "--json"),
     "accept", _DPSGD_TRAIN_IN, ("run",)),
    ("train-eval-label-two", _TRAIN + ("--eval", "e.csv"), "reject",
     _TRAIN_IN + (Artefact("e.csv", "train-csv", _variant("csv", label=_at(5, 2))),)),
    ("train-eval-garbage", _TRAIN + ("--eval", "e.parquet"), "reject",
     _TRAIN_IN + (Artefact("e.parquet", "train-parquet", lambda b: b[:100]),)),
    ("train-plan-without-features", ("train", "plan.json", "--data", "train.parquet", "--out", "run"), "reject",
     (Artefact("plan.json", "plan-rr-impression"), Artefact("train.parquet", "train-parquet"))),
    ("train-user-plan-valid", _TRAIN + ("--json",), "accept",
     (Artefact("plan.json", "plan-train-user"), Artefact("train.parquet", "train-parquet")), ("run",)),
    # statements of a plan or a run, in UTF-8 when the scenario's name is not ASCII
    ("statement-non-ascii-stdout", ("statement", "plan.json"), "accept", (Artefact("plan.json", "plan-non-ascii"),)),
    ("statement-non-ascii-file", ("statement", "plan.json", "-o", "s.txt"), "accept",
     (Artefact("plan.json", "plan-non-ascii"),), ("s.txt",)),
    ("show-non-ascii", ("show", "plan.json"), "accept", (Artefact("plan.json", "plan-non-ascii"),)),
    # an output that is an input would destroy it
    ("plan-over-its-scenario", ("plan", "s.toml", "-o", "s.toml"), "reject",
     (Artefact("s.toml", "scenario-small-rr"),)),
    ("plan-over-its-scenario-relative", ("plan", "s.toml", "-o", "./d/../s.toml"), "reject",
     (Artefact("s.toml", "scenario-small-rr"), Dir("d"))),
    ("statement-over-its-plan", ("statement", "plan.json", "-o", "plan.json"), "reject",
     (Artefact("plan.json", "plan-rr-impression"),)),
    ("statement-over-the-run-record", ("statement", "run", "-o", "run/run.json"), "reject",
     (Artefact("run", "run-rr"),)),
    ("statement-over-the-plan-beside", ("statement", "run/run.json", "-o", "run/plan.json"), "reject",
     (Artefact("run", "run-rr"),)),
    # the shell
    ("no-arguments", (), "reject"),
    ("group-without-command", ("plot",), "reject"),
    ("data-without-command", ("data",), "reject"),
    ("unknown-command", ("nope",), "reject"),
    ("unknown-option", ("rr", "--epsilon", "1", "--bogus"), "reject"),
    ("option-missing-value", ("rr", "--epsilon"), "reject"),
    ("extra-argument", ("rr", "--epsilon", "1", "extra"), "reject"),
    ("choice-bad", ("rr", "--epsilon", "1", "--accountant", "moments"), "reject"),
    ("version", ("--version",), "accept"),
    ("help", ("--help",), "accept"),
)


def misc_cases() -> list[Case]:
    out = []
    for row in CASES:
        name, argv, expect, inputs, outputs, xfail = (row + ((), (), None))[:6] if len(row) < 6 else row
        out.append(Case(id=f"misc-{name}", argv=argv, expect=expect, inputs=inputs, outputs=outputs, xfail=xfail))
    return out
