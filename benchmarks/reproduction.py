"""Seeded runs reproduce: two trainings of one small DP-SGD plan from one seed give the same run.

The commands a user runs, each in its own process (``python -m budgetplan ...``):

1. ``data synth --shape pctr --rows R --users R/5`` (the Criteo pCTR layout, data seed 0);
2. ``plan``: DP-SGD over the R rows, one epoch at an expected batch of ``--batch``, C = 5,
   eps 8, delta 0.1/N, replace-one, per impression, with today's planner defaults;
3. ``train plan.json --data DIR --seed S --device D`` twice (runs ``a`` and ``b``), and once
   with seed S + 1 (``other-seed``), at the trainer's defaults for the device (on CUDA a
   seeded run takes torch's deterministic kernels: ``trainers.inputs.reproducible_kernels``).

Then every file of run ``a``'s directory is compared with ``b``'s, and with ``other-seed``'s:

- ``model.pt``: every tensor, bit for bit (``torch.equal``), and the file byte for byte;
- each JSON file (``run.json``, ``plan.json``, ``private/record.json``): field by field,
  less the fields not meant to repeat (``UNREPEATABLE``): wall-clock timings and memory
  peaks, each run's fresh fingerprint key and the hashes over it; the records' own sha256 cover
  these;
- ``private/fingerprint.key``: a fresh random key per run by design, not compared;
- every other file (the ledger, the calibration release), byte for byte.

Passed when ``a`` and ``b`` show no difference and ``other-seed`` differs from ``a`` in the
model (a comparison that cannot see a different seed proves nothing). The script exits 1
after writing its results when the check fails.

Writes ``results/reproduction.json`` and ``.md`` (``reproduction_cuda.*`` on a GPU). Not a
test: ``python benchmarks/reproduction.py [--device cuda]`` (about a minute on 2 cores;
``benchmarks/gpu_suite.py`` runs it on a GPU). ``--smoke --out DIR``: 2,000 rows at batch 256.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import harness as h

SHAPE = "pctr"
RUNS = ("a", "b", "other-seed")
# Fields (flattened names, list indices as []) that two runs from one seed need not share; a name
# covers the fields under it.
UNREPEATABLE = {
    "run.json": ("timings", "phases[].seconds", "phases[].peak_memory", "sha256", "private_sha256"),
    "private/record.json": ("data.fingerprint.hmac_sha256", "data.fingerprint.key_id", "sha256"),
}
NOT_COMPARED = ("private/fingerprint.key",)  # a fresh random key per run, by design
SMOKE = {"rows": 2_000, "batch": 256}


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", help="the trainer's device: cpu, cuda or cuda:N")
    ap.add_argument("--rows", type=int, default=50_000)
    ap.add_argument("--batch", type=int, default=1_024, help="expected DP-SGD batch (q N)")
    ap.add_argument("--seed", type=int, default=7, help="the seed of runs a and b (other-seed: this + 1)")
    ap.add_argument("--work", type=Path, default=None, help="where data and runs go (default: a fresh temp dir)")
    ap.add_argument("--out", type=Path, default=h.RESULTS)
    h.add_smoke(ap)
    args = ap.parse_args(argv)
    args.argv = list(argv)
    h.apply_smoke(ap, args, argv, SMOKE)
    if args.rows < 5 or args.batch < 1 or args.seed < 0:
        ap.error(f"--rows must be at least 5, --batch at least 1 and --seed at least 0, got {args.rows}, "
                 f"{args.batch} and {args.seed}")
    if args.device != "cpu" and args.device.split(":")[0] != "cuda":
        ap.error(f"--device must be cpu, cuda or cuda:N, got {args.device!r}")
    return args


def scenario(args) -> str:
    return h.dpsgd_scenario("reproduction", epsilon=8.0, rows=args.rows, batch=args.batch, shape=SHAPE)


def settings(args: argparse.Namespace) -> dict:
    import torch

    from trainers.dpsgd import DPSGDSettings
    from trainers.run import TrainSettings

    kind = "cuda" if args.device.startswith("cuda") else "cpu"
    return h.settings_record("reproduction.py", args.argv, {
        "device": args.device, "rows": args.rows, "users": args.rows // 5, "batch": args.batch, "seed": args.seed,
        "other_seed": args.seed + 1, "scenario": scenario(args),
        # the trainer's settings as `budgetplan train --device D` gives them (a DP-SGD plan reads no RR setting)
        "training": h.without_rr(TrainSettings(device=args.device).to_dict()),
        "dpsgd_settings": DPSGDSettings.for_device(torch.device(kind)).to_dict(),
        "unrepeatable": {k: list(v) for k, v in UNREPEATABLE.items()}, "not_compared": list(NOT_COMPARED)})


# ------------------------------------------------------------------------------------- comparing


def flatten(value, name: str = ""):
    """(name, leaf) pairs of a JSON value: ``a.b`` for keys, ``a[3]`` for list items."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from flatten(v, f"{name}.{k}" if name else str(k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from flatten(v, f"{name}[{i}]")
    else:
        yield name, value


def unrepeatable(file: str, field: str) -> bool:
    """Whether ``field`` of ``file`` is one two runs from one seed need not share (``UNREPEATABLE``)."""
    general = re.sub(r"\[\d+\]", "[]", field)
    return any(general == p or general.startswith(p + ".") for p in UNREPEATABLE.get(file, ()))


def compare_json(file: str, a, b) -> tuple[list[str], int]:
    """(the fields that differ, the fields compared) of two JSON values, less the unrepeatable ones."""
    fa, fb = dict(flatten(a)), dict(flatten(b))
    names = [n for n in sorted(set(fa) | set(fb)) if not unrepeatable(file, n)]
    return [f"{file}: {n}" for n in names if n not in fa or n not in fb or fa[n] != fb[n]], len(names)


def compare_tensors(file: str, a: dict, b: dict) -> tuple[list[str], int]:
    """(the tensors that differ, bit for bit, or exist in one only; the tensors compared) of two state dicts."""
    import torch

    out = []
    for name in sorted(set(a) | set(b)):
        x, y = a.get(name), b.get(name)
        if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and x.dtype == y.dtype
                and x.shape == y.shape and torch.equal(x, y)):
            out.append(f"{file}: {name}")
    return out, len(set(a) | set(b))


def compare_runs(a: Path, b: Path) -> dict:
    """Every file of run directory ``a`` against ``b``'s (module docstring)."""
    import torch

    files = {p.relative_to(a).as_posix() for p in a.rglob("*") if p.is_file()}
    other = {p.relative_to(b).as_posix() for p in b.rglob("*") if p.is_file()}
    differences = [f"{f}: in one run only" for f in sorted(files ^ other)]
    counts = {"tensors": 0, "fields": 0, "files": 0}
    for f in sorted((files & other) - set(NOT_COMPARED)):
        if f.endswith(".pt"):
            load = [torch.load(d / f, map_location="cpu", weights_only=True) for d in (a, b)]
            diff, n = compare_tensors(f, *load)
            if not diff and (a / f).read_bytes() != (b / f).read_bytes():
                diff = [f"{f}: bytes differ"]  # the same tensors in another archive: model.sha256 would differ
            counts["tensors"] += n
        elif f.endswith(".json"):
            diff, n = compare_json(f, *(json.loads((d / f).read_text()) for d in (a, b)))
            counts["fields"] += n
        else:
            diff = [] if (a / f).read_bytes() == (b / f).read_bytes() else [f"{f}: bytes differ"]
        counts["files"] += 1
        differences += diff
    return {"differences": differences, "compared": counts, "model_differs": any(
        d.startswith("model.pt:") for d in differences)}


# ---------------------------------------------------------------------------------------- running


def _cli(args: list[str], log: Path) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(h.ROOT), env.get("PYTHONPATH", "")) if p)
    t0 = time.perf_counter()
    with open(log, "w") as err:
        proc = subprocess.run([sys.executable, "-m", "budgetplan", *args], stdout=subprocess.DEVNULL, stderr=err,
                              env=env, cwd=h.ROOT, check=False)
    if proc.returncode:
        raise SystemExit(f"reproduction: `budgetplan {' '.join(args[:2])}` failed ({proc.returncode}): see {log}")
    return {"seconds": time.perf_counter() - t0}


def run(args) -> dict:
    work = h.work_folder(args.device, args.work, script="reproduction")
    data = work / "data"
    stages = {"synth": _cli(["data", "synth", "--shape", SHAPE, "--rows", str(args.rows), "--users",
                             str(args.rows // 5), "--out", f"{data}/"], work / "synth.log")}
    (work / "scenario.toml").write_text(scenario(args))
    stages["plan"] = _cli(["plan", str(work / "scenario.toml"), "--output", str(work / "plan.json")], work / "plan.log")
    seeds = {"a": args.seed, "b": args.seed, "other-seed": args.seed + 1}
    for name in RUNS:
        if (work / name).exists():
            raise SystemExit(f"reproduction: {work / name} exists: give a fresh --work")
        stages[f"train {name}"] = _cli(["train", str(work / "plan.json"), "--data", str(data), "--out",
                                        str(work / name), "--seed", str(seeds[name]), "--device", args.device],
                                       work / f"train-{name}.log")
    same, other = compare_runs(work / "a", work / "b"), compare_runs(work / "a", work / "other-seed")
    record = json.loads((work / "a" / "run.json").read_text())
    return {"settings": settings(args), "device": record.get("device"), "machine": h.machine(),
            "versions": h.versions(), "stages": stages, "seeds": seeds, "same_seed": same, "other_seed": other,
            "passed": not same["differences"] and other["model_differs"], "work": str(work)}


def render(result: dict) -> str:
    cfg = result["settings"]["values"]
    lines = [f"# Seeded runs reproduce ({result['device']})", "",
             f"Three trainings of one DP-SGD plan ({cfg['rows']:,} rows of the {SHAPE} layout, one epoch at an "
             f"expected batch of {cfg['batch']:,}, eps 8) with `budgetplan train --seed`: runs a and b from seed "
             f"{cfg['seed']}, a third from seed {cfg['other_seed']}. Every file of run a is compared with the "
             "others': the model's tensors bit for bit, the records field by field less "
             + "; ".join(f"`{f}`: {', '.join(v)}" for f, v in cfg["unrepeatable"].items())
             + f" (not meant to repeat: timings, memory peaks, each run's fresh fingerprint key), and the other "
             f"files byte for byte; {', '.join(cfg['not_compared'])} is a fresh random key per run.", "",
             "| comparison | model tensors | record fields | files | differences | expected |",
             "|---|---|---|---|---|---|"]
    for label, key, want in (("a against b (same seed)", "same_seed", "none"),
                             ("a against other-seed", "other_seed", "the model differs")):
        c = result[key]
        shown = "; ".join(c["differences"][:6]) + (f"; ... ({len(c['differences'])} in all)"
                                                   if len(c["differences"]) > 6 else "")
        lines.append(f"| {label} | {c['compared']['tensors']} | {c['compared']['fields']} | {c['compared']['files']} "
                     f"| {len(c['differences'])}{': ' + shown if shown else ''} | {want} |")
    lines += ["", f"**{'Passed' if result['passed'] else 'FAILED'}**: " + (
        "the two runs from one seed are the same run, and another seed gives another model." if result["passed"]
        else "see the differences above."), ""]
    lines += ["Seconds per command: " + ", ".join(f"{k} {v['seconds']:.1f}" for k, v in result["stages"].items())
              + ".", "", h.settings_markdown(result["settings"]), ""]
    return "\n".join(lines)


def main(argv: list[str]) -> dict:
    args = parse_args(argv)
    result = run(args)
    print(h.save_results(args.out, h.results_name("reproduction", args.device), result, render))
    if not result["passed"]:
        raise SystemExit(1)
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
