"""Training throughput per epoch (extrapolated on CPU) and the WALR release against memory bandwidth.

"One non-private epoch and one DP-SGD epoch over 40 million synthetic rows" is a GPU target.
What is measured here, on whatever device runs it (``--device cpu|cuda``):

- ``non-private``: a plain loop over a shuffled permutation of the rows, batch 16,384: gather
  the rows, forward, ``bce(...).mean().backward()``, SGD (lr 0.1, momentum 0.9) step;
- ``dpsgd``: the real engine, ``trainers.dpsgd.run_dpsgd`` with a plan-like params dict
  (Poisson sampling at q = 16,384 / N with the engine's padded chunk, per-example clipping
  at C = 1, noise multiplier 1, SGD with momentum and cosine decay, as a plan runs it);

each for ``--steps`` (20) steps after a short warm-up, at the ``pctr`` and ``attribution``
shapes of ``harness.SHAPES``, over N = 2^20 synthetic rows held in memory, each (shape,
mode) in a fresh subprocess with a per-step time limit. Reported: rows/s (real rows; the
DP-SGD chunk is padded to E + 6 sqrt(E) rows, and padded rows cost compute but are not
counted) and the time one epoch over 40,000,000 rows would take at that rate,
``40e6 / rows_per_s``, labelled as an extrapolation (a 40M-row dataset is not built here;
on CPU the row gather from a 40M-row table would be somewhat slower than from 1M rows).

WALR: ``trainers.walr.release_throughput`` over 16,000,000 rows x 20 features (intercept
included, float32): the one private release's rows/s and bytes/s (what it reads from memory,
``trainers.walr.bytes_moved``), ``--walr-repeats`` (5) runs at one torch thread and at torch's
default (on a CPU; the two interleaved), each run followed by a copy of the same input bytes
(rows, weights, labels) under the same load: the median of the runs' release time over copy
time is the figure (target <= 2x). Beside it, this machine's memory bandwidth measured on a
2 GiB float32 array: the best of a numpy sum, a torch sum (all threads) and a numpy copy
(read + write bytes counted), each the best of 5.

Writes ``benchmarks/results/epoch_throughput.json`` and ``epoch_throughput.md`` (``*_cuda.*`` on a GPU). Not a test:
run it with ``python benchmarks/epoch_throughput.py [--device cuda] [--threads 1] [--quick]``
(about 2.5 minutes on 2 CPU cores); ``--threads N`` sets torch's threads in the training
children only (1 is far steadier on a small shared machine; the release and the bandwidth
keep all threads); ``--quick`` times 3 steps at batch 4,096 over 2^18 rows and the release
over 4M rows (2 runs); ``--render`` rewrites the markdown from the existing JSON; ``--smoke --out DIR``
runs both modes and the release at a reduced shape and tiny sizes (a few seconds).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import time

import harness as h

EPOCH_ROWS = 40_000_000
STEP_LIMIT = 120.0
CLIP, SIGMA, LR = 1.0, 1.0, 0.1
DPSGD = {"optimizer": "sgd", "lr": LR, "cosine_decay": True}  # the DP-SGD phase as the Hybrid paper runs it
WALR_FEATURES, BANDWIDTH_BYTES, BANDWIDTH_REPEATS = 20, 2 << 30, 5
WALR_CPU_THREADS = (1, None)  # the release at one torch thread, then at torch's default
# --smoke: both modes (each in its own process) at one reduced shape, the release and the bandwidth, all tiny
SMOKE = {"shapes": "attribution-reduced", "rows": 4096, "batch": 256, "steps": 2, "warmup": 1, "threads": 1,
         "walr_rows": 20_000, "walr_repeats": 1, "bandwidth_bytes": 8 << 20}


def child(spec: dict) -> None:
    import torch

    from trainers.losses import bce
    from trainers.models import build_model

    device, mode, batch, steps, rows = spec["device"], spec["mode"], spec["batch"], spec["steps"], spec["rows"]
    cfg = h.SHAPES[spec["shape"]]
    if spec.get("threads"):
        torch.set_num_threads(int(spec["threads"]))
    if not h.apply_allocator(spec):
        return
    if not device.startswith("cuda"):
        h.limit_address_space()
    mem = h.Memory(device)
    torch.manual_seed(0)
    model = build_model("mlp", cfg).to(device)
    ns_cat, ns_num, s_cat, s_num, label = h.synthetic_inputs(cfg, rows, device)
    h.emit("ready")
    try:
        if mode == "non-private":
            out = _nonprivate(model, (ns_cat, ns_num, s_cat, s_num, label), batch, steps, spec["warmup"], device, bce)
        else:
            out = _dpsgd(model, (ns_cat, ns_num, s_cat, s_num, label), cfg, batch, steps, spec["warmup"], device,
                         spec["dpsgd"])
    except Exception as exc:  # noqa: BLE001 - recorded as infeasible, with the reason
        h.emit("error", reason=h.failure_reason(exc), message=f"{type(exc).__name__}: {str(exc)[:500]}")
        return
    h.emit("done", **out, memory=mem.report())


def _nonprivate(model, tensors, batch, steps, warmup, device, bce) -> dict:
    import torch

    rows = tensors[0].shape[0]
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    order = torch.randperm(rows, device=device)
    per_epoch = rows // batch

    def step(i):
        idx = order[(i % per_epoch) * batch:(i % per_epoch + 1) * batch]
        ns_cat, ns_num, s_cat, s_num, label = (t[idx] for t in tensors)
        opt.zero_grad(set_to_none=True)
        bce(model(ns_cat, ns_num, s_cat, s_num), label).backward()
        opt.step()

    for i in range(warmup):
        step(i)
        h.emit("step", phase="warmup")
    h.sync(device)
    t0 = time.perf_counter()
    marks = [t0]
    for i in range(steps):
        step(warmup + i)
        h.sync(device)
        marks.append(time.perf_counter())
        h.emit("step", phase="timed")
    seconds = marks[-1] - t0
    return {"steps": steps, "rows_processed": steps * batch, "rows_real": steps * batch, "seconds": seconds,
            "step_seconds_median": statistics.median(b - a for a, b in itertools.pairwise(marks))}


class _Beacon:
    """A ledger for run_dpsgd that only reports each step to the parent (its watchdog) and times it."""

    def __init__(self, device):
        self.device, self.marks = device, []

    def intend(self, step, batch_size=None):
        h.sync(self.device)
        self.marks.append(time.perf_counter())
        h.emit("step", phase="dpsgd", step=step)


def _dpsgd(model, tensors, cfg, batch, steps, warmup, device, dpsgd: dict) -> dict:
    from trainers.data.encoded import EncodedData
    from trainers.dpsgd import DPSGDSettings, run_dpsgd
    from trainers.randomness import Randomness

    ns_cat, ns_num, s_cat, s_num, label = tensors
    rows = label.shape[0]
    data = EncodedData(ns_cat, ns_num, s_cat, s_num, label, None, cfg["ns_vocab"], cfg["s_vocab"])
    trainable = list(model.parameters())

    def params(n_steps):
        from budgetplan.plan.phases import DPSGDParams

        return DPSGDParams(noise_multiplier=SIGMA, noise_std=SIGMA * CLIP, clipping_norm=CLIP, sensitivity=CLIP,
                           sampling_rate=batch / rows, steps=n_steps, batch_size=batch,
                           epochs=n_steps * batch / rows, dataset_size=rows, sampling="poisson",
                           max_batch_size=None, cap=1, capping=None, normalise_by="q*N", model="full")

    settings = DPSGDSettings.for_device(device, **dpsgd)
    if warmup:
        run_dpsgd(model, data, params(warmup), trainable=trainable, randomness=Randomness(1), settings=settings,
                  ledger=_Beacon(device))
    beacon = _Beacon(device)
    h.sync(device)
    t0 = time.perf_counter()
    rec = run_dpsgd(model, data, params(steps), trainable=trainable, randomness=Randomness(2), settings=settings,
                    ledger=beacon)
    h.sync(device)
    seconds = time.perf_counter() - t0
    marks = beacon.marks + [t0 + seconds]
    return {"steps": rec.steps_taken, "rows_real": sum(rec.batch_sizes),
            "rows_processed": rec.chunks * rec.padded_size, "padded_size": rec.padded_size,
            "chunks": rec.chunks, "seconds": seconds, "engine_seconds": rec.seconds,
            "step_seconds_median": statistics.median(b - a for a, b in itertools.pairwise(marks)),
            "clipped_fraction": rec.clipped_fraction, "trainable_parameters": rec.trainable_parameters}


# ----------------------------------------------------------------------------------------- WALR


def bandwidth(device: str, nbytes: int = 2 << 30, repeats: int = 5) -> dict:
    """Best-of-``repeats`` read bandwidth (bytes/s) of numpy sum, torch sum, and numpy copy (read + write)."""
    import numpy as np
    import torch

    out = {"array_bytes": nbytes}
    n = nbytes // 4
    if device.startswith("cuda"):
        x = torch.ones(n, device=device)
        y = torch.empty_like(x)
        best_sum = best_copy = float("inf")
        for _ in range(repeats):
            h.sync(device)
            t0 = time.perf_counter()
            float(x.sum())
            best_sum = min(best_sum, time.perf_counter() - t0)
            h.sync(device)
            t0 = time.perf_counter()
            y.copy_(x)
            h.sync(device)
            best_copy = min(best_copy, time.perf_counter() - t0)
        out["torch_sum_bytes_per_s"] = nbytes / best_sum
        out["torch_copy_bytes_per_s"] = 2 * nbytes / best_copy
        del x, y
    else:
        a = np.ones(n, dtype=np.float32)
        b = np.empty_like(a)
        t = torch.from_numpy(a)
        best = {"numpy_sum": float("inf"), "torch_sum": float("inf"), "numpy_copy": float("inf")}
        for _ in range(repeats):
            t0 = time.perf_counter()
            a.sum()
            best["numpy_sum"] = min(best["numpy_sum"], time.perf_counter() - t0)
            t0 = time.perf_counter()
            float(t.sum())
            best["torch_sum"] = min(best["torch_sum"], time.perf_counter() - t0)
            t0 = time.perf_counter()
            np.copyto(b, a)
            best["numpy_copy"] = min(best["numpy_copy"], time.perf_counter() - t0)
        out["numpy_sum_bytes_per_s"] = nbytes / best["numpy_sum"]
        out["torch_sum_bytes_per_s"] = nbytes / best["torch_sum"]
        out["numpy_copy_bytes_per_s"] = 2 * nbytes / best["numpy_copy"]
        del a, b, t
    reads = [v for k, v in out.items() if k.endswith("_sum_bytes_per_s")]
    out["read_bytes_per_s"] = max(reads)
    out["best_bytes_per_s"] = max(v for k, v in out.items() if k.endswith("_bytes_per_s"))
    return out


def _walr_summary(runs: list[dict]) -> dict:
    rows, secs = runs[0]["rows"], statistics.median(r["seconds"] for r in runs)
    best = min(r["seconds"] for r in runs)
    nbytes = runs[0]["bytes_moved"]
    # each run's release against the copy of its input right after it (side by side, same load)
    over = [r["seconds"] / r["copy_seconds"] for r in runs]
    return {"rows": rows, "k": runs[0]["k"], "repeats": len(runs), "threads": runs[0]["threads"],
            "seconds_median": secs, "seconds_min": best, "seconds_all": [r["seconds"] for r in runs],
            "rows_per_s": rows / secs, "bytes_per_s": nbytes / secs, "best_rows_per_s": rows / best,
            "best_bytes_per_s": nbytes / best, "bytes_read": nbytes, "bytes_moved": nbytes,
            "input_bytes": runs[0]["input_bytes"], "copy_seconds_all": [r["copy_seconds"] for r in runs],
            "copy_bytes_per_s_median": statistics.median(r["copy_bytes_per_s"] for r in runs),
            "fraction_of_copy_all": [r["bytes_per_s"] / r["copy_bytes_per_s"] for r in runs],
            "fraction_of_copy_median": statistics.median(r["bytes_per_s"] / r["copy_bytes_per_s"] for r in runs),
            "time_over_copy_all": over, "time_over_copy_median": statistics.median(over),
            "load_average_1min": [r["load_average_1min"] for r in runs]}


def walr(device: str, rows: int, k: int, repeats: int, threads: tuple[int | None, ...]) -> dict:
    """``release_throughput`` ``repeats`` times per thread setting, the settings interleaved (each
    release followed by its copy); one summary per setting, keyed by its threads (None: torch's default)."""
    from trainers.walr import release_throughput

    runs: dict[int | None, list[dict]] = {t: [] for t in threads}
    for _ in range(repeats):
        for t in threads:
            load = os.getloadavg()[0]
            runs[t].append({**release_throughput(rows, k, device=device, threads=t), "load_average_1min": load})
    return {t: _walr_summary(r) for t, r in runs.items()}


# --------------------------------------------------------------------------------------- parent


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--quick", action="store_true",
                        help="3 steps at batch 4,096 over 2^18 rows; release over 4M rows")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--batch", type=int, default=None)
    parser.add_argument("--rows", type=int, default=None, help="synthetic rows held in memory (default 2^20)")
    parser.add_argument("--walr-rows", type=int, default=None)
    parser.add_argument("--walr-repeats", type=int, default=5)
    parser.add_argument("--shapes", default="pctr,attribution")
    parser.add_argument("--skip-walr", action="store_true")
    parser.add_argument("--max-chunk", type=int, default=None,
                        help="DP-SGD's largest chunk (default: the trainer's for the device, DPSGDSettings.for_device)")
    parser.add_argument("--step-limit", type=float, default=STEP_LIMIT)
    parser.add_argument("--threads", type=int, default=None,
                        help="torch.set_num_threads in the training children (the WALR part keeps all threads)")
    parser.add_argument("--allocator", choices=("tuned", "system"), default="tuned",
                        help="CPU: both training children run with trainers.allocator.tune_allocator (tuned, what "
                             "`budgetplan train` does) or with glibc's defaults (system); the WALR part keeps glibc's")
    parser.add_argument("--render", action="store_true", help="rewrite the .md from the existing .json")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    h.add_smoke(parser, out=True)
    args = parser.parse_args(argv)
    args.argv = list(argv)
    args.bandwidth_bytes = BANDWIDTH_BYTES
    h.apply_smoke(parser, args, argv, SMOKE)
    # what --quick and the defaults resolve to (settings() records them, main() runs them)
    args.steps = args.steps or (3 if args.quick else 20)
    args.batch = args.batch or (4096 if args.quick else 16384)
    args.rows = args.rows or (1 << 18 if args.quick else 1 << 20)
    args.walr_rows = args.walr_rows or (4_000_000 if args.quick else 16_000_000)
    args.walr_repeats = 2 if args.quick else args.walr_repeats
    args.shape_list = [s for s in args.shapes.split(",") if s]
    args.dpsgd = dict(DPSGD, **({} if args.max_chunk is None else {"max_chunk": args.max_chunk}))
    return args


def settings(args: argparse.Namespace) -> dict:
    """Every setting (torch threads None: torch's default, resolved in ``machine``); DP-SGD's from the library."""
    from trainers.dpsgd import DPSGDSettings

    return h.settings_record("epoch_throughput.py", args.argv, {
        "device": args.device, "quick": args.quick, "steps": args.steps, "warmup_steps": args.warmup,
        "batch": args.batch, "rows_in_memory": args.rows, "extrapolated_to_rows": EPOCH_ROWS,
        "clipping_norm": CLIP, "noise_multiplier": SIGMA, "nonprivate_optimizer": {"name": "sgd", "lr": LR,
                                                                                     "momentum": 0.9},
        "dpsgd_settings": DPSGDSettings.for_device(args.device, **args.dpsgd).to_dict(),
        "step_limit_seconds": args.step_limit,
        "torch_threads_training": args.threads, "shapes": {s: h.SHAPES[s] for s in args.shape_list},
        "walr": None if args.skip_walr else {"rows": args.walr_rows, "features": WALR_FEATURES,
                                             "repeats": args.walr_repeats, "bandwidth_bytes": args.bandwidth_bytes,
                                             "bandwidth_repeats": BANDWIDTH_REPEATS, **walr_threads(args)}}
        | ({} if args.device.startswith("cuda") else {"allocator_training": args.allocator}))


def walr_threads(args: argparse.Namespace) -> dict:
    """The release's torch threads on a CPU (one, then the default, interleaved); nothing on a GPU."""
    return {} if args.device.startswith("cuda") else {"threads": list(WALR_CPU_THREADS)}


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    if args.child is not None:
        child(json.loads(args.child))
        return
    stem = h.results_name("epoch_throughput", args.device)
    if args.render:
        result = json.loads((args.out / f"{stem}.json").read_text())
        (args.out / f"{stem}.md").write_text(_markdown(result))
        print(_markdown(result))
        return

    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device here")
    steps, batch, rows, walr_rows = args.steps, args.batch, args.rows, args.walr_rows

    runs = []
    for shape in args.shape_list:
        for mode in ("non-private", "dpsgd"):
            spec = {"shape": shape, "mode": mode, "device": args.device, "batch": batch, "steps": steps,
                    "warmup": args.warmup, "rows": rows, "threads": args.threads, "dpsgd": args.dpsgd,
                    "allocator": None if args.device.startswith("cuda") else args.allocator}
            print(f"[epoch_throughput] {shape} {mode} ...", file=sys.stderr, flush=True)
            load_before = os.getloadavg()[0]
            res = h.run_child(__file__, spec, step_limit=args.step_limit)
            row = {"shape": shape, "mode": mode, "batch": batch, "rows_in_memory": rows, **res,
                   "load_average_1min": [load_before, os.getloadavg()[0]]}
            if res["status"] == "ok":
                row["rows_per_s"] = res["rows_real"] / res["seconds"]
                row["epoch_40m_seconds_extrapolated"] = EPOCH_ROWS / row["rows_per_s"]
                # the median step is less exposed to other jobs' bursts on a shared machine
                row["rows_per_s_at_median_step"] = res["rows_real"] / res["steps"] / res["step_seconds_median"]
                row["epoch_40m_seconds_at_median_step"] = EPOCH_ROWS / row["rows_per_s_at_median_step"]
                print(f"    -> {row['rows_per_s']:,.0f} rows/s", file=sys.stderr, flush=True)
            else:
                print(f"    -> {res['status']}: {res.get('reason')}", file=sys.stderr, flush=True)
            runs.append(row)

    release = None
    if not args.skip_walr:
        print("[epoch_throughput] memory bandwidth and WALR release ...", file=sys.stderr, flush=True)
        bw = bandwidth(args.device, args.bandwidth_bytes, BANDWIDTH_REPEATS)
        threads = tuple(walr_threads(args).get("threads", [None]))
        by_threads = walr(args.device, walr_rows, WALR_FEATURES, args.walr_repeats, threads)
        for rel in by_threads.values():
            rel["fraction_of_read_bandwidth"] = rel["bytes_per_s"] / bw["read_bytes_per_s"]
            rel["best_fraction_of_read_bandwidth"] = rel["best_bytes_per_s"] / bw["read_bytes_per_s"]
        # "release": torch's default threads, as before; "release_one_thread" beside it on a CPU
        release = {"bandwidth": bw, "release": by_threads[None],
                   **({"release_one_thread": by_threads[1]} if 1 in by_threads else {})}

    result = {"device": h.describe_device(args.device), "device_arg": args.device,
              "machine": {**h.machine(), "torch_threads_training": args.threads or torch.get_num_threads(),
                          "torch_threads_walr": torch.get_num_threads()},
              "versions": h.versions(), "quick": args.quick, "extrapolated_to_rows": EPOCH_ROWS,
              "settings": settings(args), "runs": runs, "walr": release}
    print(h.save_results(args.out, stem, result, _markdown))


def _duration(s: float) -> str:
    return f"{s:,.0f} s ({s / 3600:.2f} h)" if s >= 3600 else f"{s:,.0f} s ({s / 60:.1f} min)"


def _size(nbytes: int) -> str:
    return f"{nbytes / 2**30:g} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:g} MiB"


def _markdown(r: dict) -> str:
    v, st, m = r["versions"], r["settings"]["values"], r["machine"]
    gpu = r["device_arg"].startswith("cuda")
    lines = [
        "# Epoch throughput benchmark",
        "",
        f"Device: **{r['device']}** ({r['machine']['cpus']} CPUs). torch {v['torch']}, Python {v['python']}."
        + (" **Quick run.**" if r["quick"] else ""),
        "",
        f"{st['steps']} timed steps (after {st['warmup_steps']} warm-up) at batch {st['batch']:,} over "
        f"{st['rows_in_memory']:,} synthetic rows, each (shape, mode) in a fresh process with torch threads "
        f"{st['torch_threads_training'] or m.get('torch_threads_training')}. `dpsgd` is the real "
        "engine (`run_dpsgd`: Poisson sampling, padded chunk, clipping C = 1, noise multiplier 1, SGD momentum "
        "0.9); `non-private` a plain shuffled loop. rows/s counts real rows only. "
        f"**The 40M-row epoch times are extrapolated{' CPU figures' if not gpu else ''} "
        f"({r['extrapolated_to_rows']:,} / rows per second), not measured over 40M rows.**"
        + ("" if gpu else " The machine is shared with other jobs (load average before/after in the table)."),
        "",
        *([f"Note: {r['note']}", ""] if r.get("note") else []),
        ("| shape | mode | steps | seconds | rows/s | 40M-row epoch (extrapolated) | rows/s at the median step | "
        "40M-row epoch at the median step | DP/non-private time | peak memory (MiB) | load | status |"),
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    np_rate = {row["shape"]: row.get("rows_per_s") for row in r["runs"] if row["mode"] == "non-private"}
    np_med_rate = {row["shape"]: row.get("rows_per_s_at_median_step") for row in r["runs"]
                   if row["mode"] == "non-private"}
    for row in r["runs"]:
        load = "/".join(f"{x:.1f}" for x in row.get("load_average_1min", []))
        if row["status"] != "ok":
            lines.append(f"| {row['shape']} | {row['mode']} | - | - | - | - | - | - | - | - | {load} | infeasible: "
                         f"{str(row.get('reason')).replace('|', '/')} |")
            continue
        ratio = "-"
        if row["mode"] == "dpsgd" and np_rate.get(row["shape"]):
            # seconds per real row, DP over non-private (total time; at the median step in brackets)
            ratio = f"{np_rate[row['shape']] / row['rows_per_s']:.2f}x"
            np_med = np_med_rate.get(row["shape"])
            if np_med:
                ratio += f" [{np_med / row['rows_per_s_at_median_step']:.2f}x]"
        extra = ""
        if row["mode"] == "dpsgd":
            extra = f" (chunk {row['padded_size']:,} rows, {row['rows_processed'] / row['rows_real'] - 1:.1%} padding)"
        lines.append(f"| {row['shape']} | {row['mode']} | {row['steps']} | {row['seconds']:.1f} | "
                     f"{row['rows_per_s']:,.0f} | {_duration(row['epoch_40m_seconds_extrapolated'])} | "
                     f"{row['rows_per_s_at_median_step']:,.0f} | "
                     f"{_duration(row['epoch_40m_seconds_at_median_step'])} | "
                     f"{ratio} | "
                     f"{h.mib(row['memory']['bytes'])} | {load} | ok{extra} |")
    w = r.get("walr")
    if w:
        lines += _walr_markdown(w, m)
    return "\n".join(lines + ["", h.settings_markdown(r["settings"])]) + "\n"


def _walr_markdown(w: dict, m: dict) -> list[str]:
    bw = w["bandwidth"]
    one = w.get("release_one_thread")
    runs = [(f"{one['threads']} thread", one)] if one else []
    runs.append((f"{w['release'].get('threads', m.get('torch_threads_walr'))} threads (torch's default)", w["release"]))
    rel0 = runs[0][1]
    lines = ["", "## WALR release", "",
             (f"`release_throughput({rel0['rows']:,}, {rel0['k']})`: {rel0['repeats']} run(s) per torch thread "
              "setting, the settings interleaved, each release followed by a copy of its input (rows, weights and "
              f"labels, {rel0['input_bytes'] / 1e9:.2f} GB; numpy, one thread) under the same load. The release reads "
              f"{rel0['bytes_moved'] / 1e9:.2f} GB from memory (`bytes_moved`: rows and weights once, labels twice)."),
             "",
             ("| release threads | release s (median) | best | GB/s read | release / copy time (median) | "
              "each run | read rate / copy rate | load (1 min) |"),
             "|---|---|---|---|---|---|---|---|"]
    for label, rel in runs:
        if "time_over_copy_all" not in rel:
            continue
        each = ", ".join(f"{x:.2f}" for x in rel["time_over_copy_all"])
        load = "/".join(f"{x:.1f}" for x in rel.get("load_average_1min", []))
        lines.append(f"| {label} | {rel['seconds_median']:.3f} | {rel['seconds_min']:.3f} | "
                     f"{rel['bytes_per_s'] / 1e9:.2f} | **{rel['time_over_copy_median']:.2f}x** | {each} | "
                     f"{rel['input_bytes'] / rel['bytes_moved'] / rel['time_over_copy_median']:.0%} | {load} |")
    lines += ["", ("Target: at most about 2x the copy's time (the release reading its bytes at >= 50% of the rate "
                   "the copy copies them, each byte counted once; `fraction_of_copy` in the JSON counts the copy's "
                   "reads and writes, so it is half that).")]
    size = _size(bw["array_bytes"])
    lines += ["", "| bandwidth probe | GB/s |", "|---|---|"]
    for key, label in (("numpy_sum_bytes_per_s", f"numpy sum of {size} float32 (1 thread)"),
                       ("torch_sum_bytes_per_s", f"torch sum of {size} float32 (all threads)"),
                       ("numpy_copy_bytes_per_s", f"numpy copy of {size} (read + write counted)"),
                       ("torch_copy_bytes_per_s", f"torch copy of {size} (read + write counted)")):
        if key in bw:
            lines.append(f"| {label} | {bw[key] / 1e9:.2f} |")
    rel = w["release"]
    lines += ["", (f"Release bytes/s at torch's default threads: {rel['fraction_of_read_bandwidth']:.0%} of the "
                   f"best-of-5 read bandwidth ({bw['read_bytes_per_s'] / 1e9:.2f} GB/s) for the median run, "
                   f"{rel['best_fraction_of_read_bandwidth']:.0%} for the best run.")]
    return lines


if __name__ == "__main__":
    main(sys.argv[1:])
