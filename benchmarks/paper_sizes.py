"""The paper's sizes, measured end to end: one DP-SGD epoch over 40M Criteo-layout rows on this machine.

The commands a user runs, each in its own process and timed, its peak memory sampled (the
sum over the process and its children, every 0.5 s):

1. ``budgetplan data synth --shape pctr --rows R --users R/5 --out DIR/`` (skipped when the
   directory exists: ``--data``);
2. ``budgetplan plan``: DP-SGD over the R rows, one epoch at batch ``--batch``, C = 5, eps 8,
   delta 0.1/N, replace-one, per impression, no calibration;
3. ``budgetplan train plan.json --data DIR --out RUN --threads auto --nproc P`` for each P in
   ``--nproc`` (hashed categoricals, the DP-SGD step size 0.01), the record's own timings
   beside the wall time (read, encode, DP-SGD phase, its rows per second);
4. ``budgetplan audit RUN --data DIR``.

``--device`` (``auto``, ``cpu``, ``cuda``, ``cuda:N``; default ``auto``) is the trainer's; on
CUDA each run also records the training process's peak GPU memory (the record's DP-SGD phase:
``torch.cuda.max_memory_allocated`` over the whole run, the encoded data included) beside the
peak RSS.

Not a test: ``python benchmarks/paper_sizes.py`` (about 40 minutes at 40M rows on 2 cores);
writes ``results/paper_sizes.json`` and ``.md`` (``paper_sizes_cuda.*`` with ``--device cuda``,
unless ``--name`` is given; ``benchmarks/gpu_suite.py`` runs it so on a GPU). ``--rows 4000000 --nproc 1,2 --name
paper_sizes_4m`` gives the processes' scaling table at a size two processes fit twice. ``--smoke --out DIR``:
every command at 2,000 rows and batch 256, one process (distributed.py's smoke runs two).

Pinned at what ``results/paper_sizes.json`` was measured with (a 40M-row run takes hours):
the DP-SGD step size 0.01 (the default then; the automatic 0.12 / sqrt(T) came later, and
the throughput does not depend on it), and the plan as planned then: the scenario it records,
with calibration off (``[calibration]`` was opt-in then; ``harness.as_planned_then``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import harness as h

SHAPE = "pctr"
DPSGD_LR = 0.01  # the DP-SGD step size results/paper_sizes.json was timed at (throughput does not depend on it)


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=40_000_000)
    ap.add_argument("--batch", type=int, default=16_384, help="expected DP-SGD batch (q N)")
    ap.add_argument("--epsilon", type=float, default=8.0)
    ap.add_argument("--nproc", default="1", help="comma-separated process counts, each a run")
    ap.add_argument("--data", type=Path, default=None, help="an existing `data synth --shape pctr` directory")
    ap.add_argument("--work", type=Path, default=None, help="where data and runs go (default: a fresh temp dir)")
    ap.add_argument("--device", default="auto", help="the trainer's device: auto, cpu, cuda or cuda:N")
    ap.add_argument("--name", default=None, help="results file stem (default paper_sizes, paper_sizes_cuda on CUDA)")
    ap.add_argument("--out", type=Path, default=h.RESULTS)
    h.add_smoke(ap)
    args = ap.parse_args(argv)
    args.argv = list(argv)
    h.apply_smoke(ap, args, argv, {"rows": 2_000, "batch": 256, "nproc": "1"})
    if args.rows < 1 or args.batch < 1:
        ap.error("--rows and --batch must be at least 1")
    try:
        args.counts = [int(c) for c in args.nproc.split(",") if c]
    except ValueError:
        ap.error(f"--nproc: not a comma-separated list of integers: {args.nproc!r}")
    if not args.counts or min(args.counts) < 1:
        ap.error(f"--nproc counts must be at least 1, got {args.nproc!r}")
    if args.device not in ("auto", "cpu") and not args.device.split(":")[0] == "cuda":
        ap.error(f"--device must be auto, cpu, cuda or cuda:N, got {args.device!r}")
    args.name = args.name or h.results_name("paper_sizes", _kind(args.device))
    return args


def scenario(args) -> str:
    return h.dpsgd_scenario("paper-sizes", epsilon=args.epsilon, rows=args.rows, batch=args.batch, shape=SHAPE)


def _kind(device: str) -> str:
    """``cuda`` or ``cpu``: ``cuda`` taken at its word (a CUDA run's settings read back on a machine without
    one), ``auto`` what the trainer resolves it to here."""
    import torch

    return "cuda" if device.startswith("cuda") or device == "auto" and torch.cuda.is_available() else "cpu"


def _train_settings(device: str = "auto"):
    """(TrainSettings, DPSGDSettings) of every run on ``device``: hashed categoricals, the DP-SGD step
    size pinned, the trainer's chunk for the device kind (``DPSGDSettings.for_device``, ``_kind``)."""
    import torch

    from trainers.dpsgd import DPSGDSettings
    from trainers.run import TrainSettings

    return (TrainSettings(nonsensitive_encoding="hash", device=device),
            DPSGDSettings.for_device(torch.device(_kind(device)), lr=DPSGD_LR))


def settings(args: argparse.Namespace) -> dict:
    from trainers.data.synth import get_shape

    training, dpsgd = _train_settings(args.device)
    return h.settings_record("paper_sizes.py", args.argv, {
        "rows": args.rows, "users": args.rows // 5, "shape": get_shape(SHAPE).parameters(), "batch": args.batch,
        "epsilon": args.epsilon, "processes": args.counts, "scenario": scenario(args),
        # a DP-SGD-only plan reads no RR setting
        "training": h.without_rr(training.to_dict()), "dpsgd_settings": dpsgd.to_dict(), "threads": "auto"})


def _train_options(training, dpsgd) -> list[str]:
    """The ``budgetplan train`` options under which it trains with ``training`` and ``dpsgd`` (the
    settings recorded); refused where the command would build other settings from them."""
    from trainers.dpsgd import DPSGDSettings
    from trainers.run import TrainSettings, resolve_device

    if training.hash_bins_sensitive != training.hash_bins_nonsensitive:
        raise SystemExit("budgetplan train takes one --hash-bins for both feature groups")
    options = ["--model", training.model, "--embedding-dim", str(training.embedding_dim), "--lr", repr(training.lr),
               "--encoding", training.nonsensitive_encoding, "--vocab-threshold", str(training.vocab_threshold),
               "--hash-bins", str(training.hash_bins_nonsensitive), "--device", training.device,
               "--format", training.data_format, "--dpsgd-optimizer", dpsgd.optimizer,
               "--dpsgd-lr", "auto" if dpsgd.lr is None else repr(dpsgd.lr),
               "--dpsgd-schedule", "cosine" if dpsgd.cosine_decay else "constant"]
    # what the command builds from those options (budgetplan/cli/train_cmds.py), the rest at its defaults
    built = (TrainSettings(model=training.model, embedding_dim=training.embedding_dim, lr=training.lr,
                           loss="forward", hybrid_start="rr-model",
                           nonsensitive_encoding=training.nonsensitive_encoding,
                           vocab_threshold=training.vocab_threshold,
                           hash_bins_nonsensitive=training.hash_bins_nonsensitive,
                           hash_bins_sensitive=training.hash_bins_sensitive, device=training.device,
                           data_format=training.data_format),
             DPSGDSettings.for_device(resolve_device(training.device), optimizer=dpsgd.optimizer, lr=dpsgd.lr,
                                      cosine_decay=dpsgd.cosine_decay))
    if built != (training, dpsgd):
        raise SystemExit(f"budgetplan train would train with {built}, not the settings recorded {(training, dpsgd)}")
    return options


def _tree_rss(pid: int) -> int:
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total


def _run(cmd: list[str], log: Path) -> dict:
    """Run ``cmd``; wall seconds, peak RSS of its process tree (MiB), stdout, return code."""
    t0 = time.perf_counter()
    with open(log, "w") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True)
        peak = [0]

        def sample():
            while proc.poll() is None:
                peak[0] = max(peak[0], _tree_rss(proc.pid))
                time.sleep(0.5)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        out = proc.communicate()[0]
        sampler.join()
    return {"command": " ".join(cmd[2:]), "seconds": time.perf_counter() - t0, "peak_mib": peak[0] / 2**20,
            "returncode": proc.returncode, "stdout": out, "load_after": os.getloadavg()[0]}


def run(args) -> dict:
    from rich.console import Console

    say = Console(stderr=True).print
    work = h.work_folder(args.device, args.work, script="paper_sizes")
    py = [sys.executable, "-m"]
    result: dict = {"settings": settings(args), "stages": {}, "runs": []}
    data = args.data or work / "data"
    if args.data is None:
        say(f"synthesising {args.rows:,} rows of the {SHAPE} layout into {data}/")
        stage = _run(py + ["budgetplan", "data", "synth", "--shape", SHAPE, "--rows", str(args.rows), "--users",
                           str(args.rows // 5), "--out", f"{data}/", "--json"], work / "synth.log")
        result["stages"]["synth"] = {k: v for k, v in stage.items() if k != "stdout"}
        if stage["returncode"]:
            raise SystemExit(f"data synth failed: see {work / 'synth.log'}")
    (work / "scenario.toml").write_text(h.as_planned_then(scenario(args)))  # the plan measured (docstring)
    train_options = _train_options(*_train_settings(args.device))
    stage = _run(py + ["budgetplan", "plan", str(work / "scenario.toml"), "--output", str(work / "plan.json")],
                 work / "plan.log")
    result["stages"]["plan"] = {k: v for k, v in stage.items() if k != "stdout"}
    if stage["returncode"]:
        raise SystemExit(f"plan failed: see {work / 'plan.log'}")
    for nproc in args.counts:
        run_dir = work / f"run-{nproc}"
        say(f"training one DP-SGD epoch over {args.rows:,} rows with {nproc} process(es)")
        load = os.getloadavg()[0]
        stage = _run(py + ["budgetplan", "train", str(work / "plan.json"), "--data", str(data), "--out",
                           str(run_dir), "--threads", "auto", "--nproc", str(nproc), *train_options, "--json"],
                     work / f"train-{nproc}.log")
        if stage["returncode"]:
            raise SystemExit(f"train --nproc {nproc} failed: see {work / f'train-{nproc}.log'}")
        record = json.loads(stage["stdout"])
        timings = record["timings"]
        dp = next(p for p in record["phases"] if p["name"] == "dpsgd")
        gpu = dp.get("peak_memory") or {}
        audit = _run(py + ["budgetplan", "audit", str(run_dir), "--data", str(data), "--json"],
                     work / f"audit-{nproc}.log")
        verdict = json.loads(audit["stdout"]) if audit["stdout"].strip() else {}
        result["runs"].append({
            "processes": nproc, "load_before": load, "wall_seconds": stage["seconds"], "peak_mib": stage["peak_mib"],
            "load_seconds": timings.get("load_seconds"), "encode_seconds": timings.get("encode_seconds"),
            "dpsgd_seconds": dp["seconds"], "steps": dp["steps_executed"], "rows_sampled": dp["batch_size_sum"],
            "dpsgd_rows_per_second": dp["batch_size_sum"] / dp["seconds"],
            "torch_threads": timings.get("torch_threads"), "device": record.get("device"),
            "peak_gpu_bytes": gpu.get("bytes") if str(gpu.get("kind", "")).startswith("cuda") else None,
            "audit_seconds": audit["seconds"], "audit_passed": audit["returncode"] == 0,
            "audit_failed": [c["name"] for c in verdict.get("checks", []) if not c.get("passed")],
            "load_after": stage["load_after"]})
    result["machine"] = h.machine()
    result["work"] = str(work)
    return result


def render(result: dict) -> str:
    cfg = result["settings"]["values"]
    lines = [f"# The paper's sizes: one DP-SGD epoch over {cfg['rows']:,} rows ({SHAPE} layout)", "",
             f"Criteo pCTR layout (13 numeric, 26 categorical columns), {cfg['users']:,} users; a DP-SGD plan at eps "
             f"{cfg['epsilon']:g}, one epoch at an expected batch of {cfg['batch']:,}, C = 5; the trainer's default "
             "model, hashed categoricals, `--threads auto`. Each command in its own process; peak memory is the sum "
             "over its process tree, sampled every 0.5 s.", ""]
    for name, s in result["stages"].items():
        lines.append(f"- `{name}`: {s['seconds']:.0f} s, peak {s['peak_mib']:,.0f} MiB.")
    # runs on CUDA: the device and the training process's peak GPU memory (the CUDA allocator's)
    gpu = any(r.get("peak_gpu_bytes") is not None for r in result["runs"])
    if gpu:
        devices = sorted({str(r.get("device")) for r in result["runs"]})
        lines += ["", f"Trained on {', '.join(devices)}; peak GPU MiB is the training process's "
                      "`torch.cuda.max_memory_allocated` over the whole run, the encoded data included."]
    lines += ["", "| processes | wall s | read s | encode s | DP-SGD s | steps | DP-SGD rows/s | peak MiB | threads "
              "| audit | load before/after |" + (" peak GPU MiB |" if gpu else ""),
              "|---|---|---|---|---|---|---|---|---|---|---|" + ("---|" if gpu else "")]
    for r in result["runs"]:
        lines.append(f"| {r['processes']} | {r['wall_seconds']:.0f} | {r['load_seconds'] or 0:.1f} | "
                     f"{r['encode_seconds'] or 0:.1f} | {r['dpsgd_seconds']:.0f} | {r['steps']:,} | "
                     f"{r['dpsgd_rows_per_second']:,.0f} | {r['peak_mib']:,.0f} | {r['torch_threads']} | "
                     f"{'passed' if r['audit_passed'] else 'FAILED ' + ', '.join(r['audit_failed'])} "
                     f"({r['audit_seconds']:.0f} s) | {r['load_before']:.2f}/{r['load_after']:.2f} |"
                     + (f" {h.mib(r.get('peak_gpu_bytes'))} |" if gpu else ""))
    lines += ["", h.settings_markdown(result["settings"]), ""]
    return "\n".join(lines)


def main(argv: list[str]) -> dict:
    args = parse_args(argv)
    result = run(args)
    print(h.save_results(args.out, args.name, result, render))
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
