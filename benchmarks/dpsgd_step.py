"""One training step, side by side: non-private, our DP-SGD, Opacus 1.6 default and Opacus ghost clipping.

What is measured, per (shape, batch, mode), each in a FRESH subprocess so that peak memory
belongs to that mode alone:

- ``non-private``: ``zero_grad``, forward, ``bce(...).mean().backward()``, SGD step;
- ``ours``: ``trainers.dpsgd.noisy_gradient`` on one full chunk (mask of ones: every row
  real, one chunk of ``batch`` rows), i.e. per-example clipping by book-keeping with one
  backward (``trainers.clipping``) plus the Gaussian noise and the division by the batch,
  then the SGD step;
- ``opacus``: Opacus's ``PrivacyEngine.make_private`` in its default mode
  (``grad_sample_mode="hooks"``: a ``GradSampleModule`` materialising per-sample gradients,
  ``DPOptimizer`` clipping, noise, SGD step);
- ``opacus-ghost``: ``make_private(grad_sample_mode="ghost")``: fast gradient / ghost
  clipping (``GradSampleModuleFastGradientClipping``, ``DPOptimizerFastGradientClipping``
  and the ``DPLossFastGradientClipping`` criterion wrapper, two backward passes).

Every mode uses SGD(lr 0.1, momentum 0.9) as the engine does; both DP modes clip at C = 1
with noise multiplier 1, over the SAME parameters (every parameter of the TwoTowerMLP: both
tables, the non-sensitive tower, the common tower and the head). Opacus's hooks need a
module whose forward takes one tensor: ``Packed`` (benchmark-only) splits one float tensor
[B, n_ns_cat + n_ns_num + n_s_cat + n_s_num] back into the four groups (ids are exact in
float32 below 2^24) and calls ``TwoTowerMLP.forward``; the child checks that the parameters
Opacus hooks are exactly the model's and, after the first backward, that each one got
per-sample gradients (default mode) or per-sample norms (ghost mode).

Shapes (``harness.SHAPES``; synthetic tensors, no data files): ``pctr`` (Criteo pCTR of
the Hybrid paper, batch 16,384), ``attribution`` (Criteo attribution, about 0.5M
parameters, batches 16,384 and 4,096), and the reduced ``pctr-reduced`` /
``attribution-reduced`` (5k-row tables, smaller batch) where Opacus's default mode fits,
so that a ratio against it exists; reduced rows are labelled as such.

Timing: ``--warmup`` steps, then the median of at least ``--steps`` timed steps (up to 50
for steps that take well under a second, fewer when a step is slow, at least one), with
device synchronisation on CUDA. ``--rounds`` (default 2) measures every feasible mode whose
first median is under 5 s again in a second fresh process (mode order rotated) and keeps the
lower round median: on a shared machine a whole run can land in another job's burst.
``--threads N`` sets torch's thread count in the children (recorded); on a small shared CPU
machine 1 thread gives far steadier figures than one thread per core, because any other
busy process stalls every parallel region. Every child imports opacus and runs two steps of
a tiny model of the same kind BEFORE the memory baseline, so shared-library pages that the
first forward and backward touch are counted for no mode. Memory: on CPU the process
max RSS (``getrusage``) minus the RSS just before building the model and inputs (so it
counts parameters, inputs, optimizer state and the step's working set), and torch's own
view: the peak bytes its CPU allocator held during one extra profiled step above the level
at its start (profiler memory events); on CUDA ``max_memory_allocated`` minus what was
allocated before the model. Time box: a mode that does not finish a step within
``--step-limit`` (120 s) is killed, and an allocation failure (the child caps its address
space at its free memory so that this is a clean error, not the OOM killer) is recorded as
infeasible with its reason, never a crash.

Noise floor: a DP-SGD step cannot skip its Gaussian noise, one standard normal per trainable
parameter. After its steps (and its memory readings), each ``ours`` child times the draws
alone: ``normal_`` with a generator of the same kind on the same device into preallocated
buffers of every parameter's shape, as many times as it timed steps (median). Beside ours /
non-private the table shows ours / (non-private + noise draw): how far the step is from
what no DP-SGD step can go below.

Ratios: ours / non-private (targets: <= 1.1 in time, <= 1.2 in peak memory), ours /
(non-private + noise draw), and opacus / ours, opacus-ghost / ours (target >= 3 each), on the
same shape and batch. Beside them, (non-private + noise draw) / non-private: the lowest time
ratio any DP-SGD step can reach with this noise draw, so a time target below it is out of reach
of the step's own work.

Writes ``benchmarks/results/dpsgd_step.json`` and ``dpsgd_step.md`` (``dpsgd_step_cuda.*`` on a
GPU). Not a test: run it with
``python benchmarks/dpsgd_step.py [--device cuda] [--threads 1] [--quick]`` (about 13 minutes
on 2 CPU cores). ``--quick`` runs batch 4,096 for every shape, 1 warm-up and 2 timed steps, one
round. ``--render`` rewrites the markdown from the existing JSON. ``--smoke --out DIR``: every mode,
Opacus's two included, at one reduced shape and batch 64, 1 warm-up and 1 timed step, one round.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import os
import statistics
import sys
import time

import harness as h

# ours / non-private: the step's time and peak-memory targets; Opacus / ours: the peers' (>= 3)
TIME_TARGET, MEMORY_TARGET, PEER_TARGET = 1.1, 1.2, 3.0
TARGETS = {"ours_over_nonprivate_time": f"<= {TIME_TARGET}", "ours_over_nonprivate_memory": f"<= {MEMORY_TARGET}",
           "opacus_over_ours": f">= {PEER_TARGET:g} (time and memory, both Opacus modes)"}
MODES = ("non-private", "ours", "ours-4chunks", "opacus", "opacus-ghost")
STEP_LIMIT = 120.0
TIMED_BUDGET = 60.0  # seconds of timed steps per mode at most (at least one step)
FAST_BUDGET, MAX_STEPS = 10.0, 50  # fast steps: time up to MAX_STEPS of them within about FAST_BUDGET s
REPEAT_BELOW = 5.0  # with --rounds > 1, only modes whose first median step is below this are repeated
CLIP, SIGMA, LR = 1.0, 1.0, 0.1
# --smoke: one small case (Opacus's default mode fits it) through every mode, each in its own process as always
SMOKE = {"warmup": 1, "steps": 1, "rounds": 1, "threads": 1}
SMOKE_CASES = [("attribution-reduced", 64, True)]


def cases(quick: bool) -> list[tuple[str, int, bool]]:
    """(shape, batch, reduced) in run order."""
    if quick:
        return [("pctr", 4096, False), ("pctr-reduced", 1024, True), ("attribution", 4096, False),
                ("attribution-reduced", 4096, True)]
    return [("pctr", 16384, False), ("pctr", 4096, False), ("pctr-reduced", 1024, True), ("attribution", 16384, False),
            ("attribution", 4096, False), ("attribution-reduced", 4096, True)]


# ---------------------------------------------------------------------------------------- child


def _packed_module(model, cfg):
    import torch
    from torch import nn

    sizes = (cfg["n_ns_cat"], cfg["n_ns_num"], cfg["n_s_cat"], cfg["n_s_num"])

    class Packed(nn.Module):
        """One input tensor for Opacus: split into (ns_cat, ns_num, s_cat, s_num), call the model."""

        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            ns_cat, ns_num, s_cat, s_num = torch.split(x, sizes, dim=1)
            return self.inner(ns_cat.long(), ns_num, s_cat.long(), s_num)

    return Packed(model)


def child(spec: dict) -> None:
    import torch

    device, mode, batch = spec["device"], spec["mode"], int(spec["batch"])
    cfg = h.SHAPES[spec["shape"]]
    if spec.get("threads"):
        torch.set_num_threads(int(spec["threads"]))
    if not h.apply_allocator(spec):
        return
    if not device.startswith("cuda"):
        h.limit_address_space()
    try:  # every mode imports it before the baseline, so its pages count for none of them
        import opacus  # noqa: F401
    except ImportError:
        pass

    import trainers.dpsgd  # noqa: F401  (imported before the baseline, as every mode's modules)
    from trainers.models import build_model

    _page_in(cfg, device)
    mem = h.Memory(device)
    torch.manual_seed(0)
    model = build_model("mlp", cfg).to(device)
    inputs = h.synthetic_inputs(cfg, batch, device)
    params = list(model.parameters())
    n_params = sum(p.numel() for p in params)
    checked = {"parameters": n_params}
    make = {"non-private": _non_private_step, "ours": _our_step, "ours-4chunks": _our_step}.get(mode, _opacus_step)
    step = make(mode, model, cfg, inputs, params, checked, batch, device)
    if step is None:
        return  # the error is reported
    h.sync(device)
    h.emit("ready", parameters=n_params, build_memory=mem.report())
    # built only after the memory readings, so that its buffers count for no mode
    floor = functools.partial(_noise_draw, params, device) if mode.startswith("ours") else None
    _measure(step, spec, device, mem, checked, floor)


def _noise_draw(params, device):
    """The step's noise alone: one standard normal per parameter element, with a generator like the engine's."""
    import torch

    gen = torch.Generator(device=device).manual_seed(1)
    buffers = [torch.empty_like(p, memory_format=torch.contiguous_format) for p in params]

    def draw():
        for b in buffers:
            b.normal_(generator=gen)

    return draw


def _page_in(cfg: dict, device) -> None:
    """Page in torch's common code paths (shared-library pages count in RSS) before the baseline."""
    import torch

    from trainers.losses import bce
    from trainers.models import build_model

    tiny_cfg = dict(cfg, ns_vocab=16, s_vocab=16, tower_hidden=8, common_hidden=(8,))
    tiny = build_model("mlp", tiny_cfg).to(device)
    tiny_opt = torch.optim.SGD(tiny.parameters(), lr=LR, momentum=0.9)
    for _ in range(2):
        tiny_opt.zero_grad()
        bce(tiny(*h.synthetic_inputs(tiny_cfg, 64, device)[:4]), h.synthetic_inputs(tiny_cfg, 64, device)[4]).backward()
        tiny_opt.step()
    del tiny, tiny_opt
    h.sync(device)


def _non_private_step(mode, model, cfg, inputs, params, checked, batch, device):
    import torch

    from trainers.losses import bce

    ns_cat, ns_num, s_cat, s_num, label = inputs
    opt = torch.optim.SGD(params, lr=LR, momentum=0.9)

    def step(check=False):
        opt.zero_grad(set_to_none=True)
        bce(model(ns_cat, ns_num, s_cat, s_num), label).backward()
        opt.step()

    return step


def _our_step(mode, model, cfg, inputs, params, checked, batch, device):
    import functools

    import torch

    from trainers.data.encoded import EncodedData
    from trainers.dpsgd import encoded_rows, noisy_gradient
    from trainers.losses import bce
    from trainers.sampling import Batch

    ns_cat, ns_num, s_cat, s_num, label = inputs
    data = EncodedData(ns_cat, ns_num, s_cat, s_num, label, None, cfg["ns_vocab"], cfg["s_vocab"])
    # "ours-4chunks": the same logical batch in four fixed-size chunks (DPSGDSettings.padded_size =
    # batch / 4), clipped sums added before the one noise draw: memory for a quarter of the batch.
    parts = 1 if mode == "ours" else 4
    size = batch // parts
    full = Batch(chunks=[(torch.arange(i * size, (i + 1) * size, device=device), torch.ones(size, device=device))
                         for i in range(parts)], size=size * parts, drawn=size * parts, truncated=False)
    gen = torch.Generator(device=device).manual_seed(1)
    opt = torch.optim.SGD(params, lr=LR, momentum=0.9)
    loss_fn = functools.partial(bce, reduction="none")

    def step(check=False):
        noisy_gradient(model, encoded_rows(data), full, params, clipping_norm=CLIP, noise_std=SIGMA * CLIP,
                       expected_batch=float(batch), noise_generator=gen, loss_fn=loss_fn)
        opt.step()
        if check:
            checked["parameters_with_grad"] = sum(p.numel() for p in params if p.grad is not None)

    return step


def _opacus_step(mode, model, cfg, inputs, params, checked, batch, device):
    """Opacus's step ("opacus": per-sample gradients; "opacus-ghost": ghost clipping), or None after an error."""
    import torch
    from opacus import PrivacyEngine
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    ns_cat, ns_num, s_cat, s_num, label = inputs
    wrapper = _packed_module(model, cfg)
    packed = torch.cat([ns_cat.float(), ns_num, s_cat.float(), s_num], dim=1)
    loader = DataLoader(TensorDataset(packed, label), batch_size=batch)  # one batch: expected size = batch
    engine = PrivacyEngine()
    base_opt = torch.optim.SGD(wrapper.parameters(), lr=LR, momentum=0.9)
    if mode == "opacus":
        module, opt, _ = engine.make_private(module=wrapper, optimizer=base_opt, data_loader=loader,
                                             noise_multiplier=SIGMA, max_grad_norm=CLIP, poisson_sampling=False)
        criterion = nn.BCEWithLogitsLoss()
    else:
        module, opt, criterion, _ = engine.make_private(
            module=wrapper, optimizer=base_opt, data_loader=loader, criterion=nn.BCEWithLogitsLoss(),
            noise_multiplier=SIGMA, max_grad_norm=CLIP, poisson_sampling=False, grad_sample_mode="ghost")
    hooked = [p for p in module.parameters() if p.requires_grad]
    if {id(p) for p in hooked} != {id(p) for p in params}:
        h.emit("error", reason="error", message="Opacus hooks a different parameter set than ours")
        return None
    checked["opacus_parameters"] = sum(p.numel() for p in hooked)
    checked["expected_batch_size"] = opt.expected_batch_size
    attribute, key = ("grad_sample", "per_sample_gradients_of") if mode == "opacus" else (
        "_norm_sample", "per_sample_norms_of")

    def step(check=False):
        opt.zero_grad(set_to_none=True)
        loss = criterion(module(packed), label)
        loss.backward()
        if check:
            checked[key] = sum(p.numel() for p in params if getattr(p, attribute, None) is not None)
        opt.step()

    return step


def _measure(step, spec: dict, device, mem, checked: dict, floor=None) -> None:
    """Warm up, time the steps, measure the memory, then time ``floor()``'s noise draw as often as the
    steps (when given); emit ``done`` (or ``error``)."""
    cpu_times = []

    def timed(check=False) -> float:
        h.sync(device)
        t0, c0 = time.perf_counter(), time.process_time()
        step(check)
        h.sync(device)
        cpu_times.append(time.process_time() - c0)
        return time.perf_counter() - t0

    try:
        warm = []
        for i in range(spec["warmup"]):
            warm.append(timed(check=i == 0))
            h.emit("step", phase="warmup", seconds=warm[-1])
        cpu_times.clear()
        times = []
        n_timed = spec["steps"]
        if warm and warm[-1] > 0:
            # fast steps get more samples (a steadier median on a shared machine), slow ones fewer
            n_timed = max(n_timed, min(MAX_STEPS, int(FAST_BUDGET / warm[-1])))
            n_timed = max(1, min(n_timed, int(TIMED_BUDGET / warm[-1])))
        for _ in range(n_timed):
            times.append(timed(check=not warm and not times))
            h.emit("step", phase="timed", seconds=times[-1])
        memory = mem.report()
        torch_view = None
        if device.startswith("cuda"):
            torch_view = memory["bytes"]
        elif statistics.median(times) < 30:
            torch_view = h.torch_cpu_step_peak(step)
            h.emit("step", phase="profiled")
        noise = None
        if floor is not None:
            draw = floor()
            draw()  # warm-up
            noise = []
            for _ in times:
                h.sync(device)
                t0 = time.perf_counter()
                draw()
                h.sync(device)
                noise.append(time.perf_counter() - t0)
    except Exception as exc:  # noqa: BLE001 - recorded as infeasible, with the reason
        h.emit("error", reason=h.failure_reason(exc), message=f"{type(exc).__name__}: {str(exc)[:500]}")
        return
    h.emit("done", step_seconds_median=statistics.median(times), step_seconds_min=min(times), step_seconds=times,
           step_cpu_seconds_median=statistics.median(cpu_times), warmup_seconds=warm,
           memory=memory, torch_step_peak_bytes=torch_view, checked=checked,
           **({} if noise is None else {"noise_seconds_median": statistics.median(noise), "noise_seconds": noise}))


# --------------------------------------------------------------------------------------- parent


def _estimate_opacus_bytes(cfg: dict, batch: int) -> int:
    """Opacus default mode holds one float32 gradient per example for every parameter: B x P x 4 bytes."""
    import torch

    from trainers.models import build_model

    with torch.device("meta"):
        p = sum(t.numel() for t in build_model("mlp", cfg).parameters())
    return batch * p * 4


def _combine(shape, batch, reduced, mode, results: list[dict]) -> dict:
    """One row from a key's rounds: the lowest round median (the least disturbed round), the pooled minimum,
    the largest peak memory; every round kept under ``rounds``."""
    row = {"shape": shape, "reduced": reduced, "batch": batch, "mode": mode, "rounds": results}
    if mode == "opacus":
        row["opacus_per_sample_gradient_bytes_estimate"] = _estimate_opacus_bytes(h.SHAPES[shape], batch)
    ok = [r for r in results if r["status"] == "ok"]
    if not ok:
        row.update(status="infeasible", reason=results[0].get("reason"), error=results[0].get("error"),
                   load_average_1min=results[0]["load_average_1min"])
        return row
    best = min(ok, key=lambda r: r["step_seconds_median"])
    noise = [r["noise_seconds_median"] for r in ok if "noise_seconds_median" in r]
    if noise:  # like the step: the lowest round median
        row["noise_seconds_median"] = min(noise)
    row.update(status="ok", step_seconds_median=best["step_seconds_median"],
               round_medians=[r["step_seconds_median"] for r in ok],
               step_seconds_min=min(r["step_seconds_min"] for r in ok),
               timed_steps=sum(len(r["step_seconds"]) for r in ok),
               memory=max((r["memory"] for r in ok), key=lambda m: m["bytes"]),
               torch_step_peak_bytes=max((r.get("torch_step_peak_bytes") or 0 for r in ok), default=None) or None,
               checked=ok[0].get("checked"),
               load_average_1min=[x for r in results for x in r["load_average_1min"]])
    return row


def _ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--quick", action="store_true", help="batch 4,096 everywhere, 1 warm-up + 2 timed steps")
    parser.add_argument("--warmup", type=int, default=None)
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--step-limit", type=float, default=STEP_LIMIT)
    parser.add_argument("--rounds", type=int, default=None,
                        help="measure each fast feasible mode this many times (fresh process each), keep the best "
                             "round's median (default 2; 1 with --quick)")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads in the children")
    parser.add_argument("--allocator", choices=("tuned", "system"), default="tuned",
                        help="CPU: every mode's child runs with trainers.allocator.tune_allocator (tuned, what "
                             "`budgetplan train` does) or with glibc's defaults (system)")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--shapes", default=None, help="comma-separated subset of the shapes")
    parser.add_argument("--render", action="store_true", help="rewrite the .md from the existing .json")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    h.add_smoke(parser, out=True)
    args = parser.parse_args(argv)
    args.argv = list(argv)
    h.apply_smoke(parser, args, argv, SMOKE)
    # what --quick and the defaults resolve to (settings() records them, main() runs them)
    args.warmup = args.warmup if args.warmup is not None else (1 if args.quick else 2)
    args.steps = args.steps if args.steps is not None else (2 if args.quick else 5)
    args.rounds = args.rounds or (1 if args.quick else 2)
    args.mode_list = [m for m in args.modes.split(",") if m]
    args.todo = SMOKE_CASES if args.smoke else cases(args.quick)
    if args.shapes:
        keep = set(args.shapes.split(","))
        args.todo = [c for c in args.todo if c[0] in keep]
    return args


def settings(args: argparse.Namespace) -> dict:
    """Every setting of the measurement (torch_threads None: torch's default, resolved in ``machine``)."""
    return h.settings_record("dpsgd_step.py", args.argv, {
        "device": args.device, "quick": args.quick, "warmup": args.warmup, "steps": args.steps,
        "timed_budget_seconds": TIMED_BUDGET, "fast_budget_seconds": FAST_BUDGET, "max_steps": MAX_STEPS,
        "rounds": args.rounds, "repeat_below_seconds": REPEAT_BELOW, "torch_threads": args.threads,
        "step_limit_seconds": args.step_limit, "clipping_norm": CLIP, "noise_multiplier": SIGMA,
        "optimizer": {"name": "sgd", "lr": LR, "momentum": 0.9}, "modes": args.mode_list,
        "cases": [{"shape": s, "batch": b, "reduced": r} for s, b, r in args.todo],
        "shapes": {s: h.SHAPES[s] for s in dict.fromkeys(c[0] for c in args.todo)}}
        | ({} if args.device.startswith("cuda") else {"allocator": args.allocator}))


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    if args.child is not None:
        child(json.loads(args.child))
        return
    stem = h.results_name("dpsgd_step", args.device)
    if args.render:
        result = json.loads((args.out / f"{stem}.json").read_text())
        (args.out / f"{stem}.md").write_text(_markdown(result))
        print(_markdown(result))
        return

    import torch

    warmup, steps, modes, todo = args.warmup, args.steps, args.mode_list, args.todo
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device here")

    rounds: dict[tuple, list[dict]] = {}
    for rnd in range(args.rounds):
        for shape, batch, _ in todo:
            # rotate the mode order each round, so no mode always runs first after a shape change
            for mode in modes[rnd % len(modes):] + modes[:rnd % len(modes)]:
                key = (shape, batch, mode)
                done = rounds.get(key, [])
                if rnd and (not done or done[0]["status"] != "ok" or done[0]["step_seconds_median"] > REPEAT_BELOW):
                    continue  # infeasible or slow modes are measured once
                spec = {"shape": shape, "batch": batch, "mode": mode, "device": args.device, "warmup": warmup,
                        "steps": steps, "threads": args.threads,
                        "allocator": None if args.device.startswith("cuda") else args.allocator}
                print(f"[dpsgd_step] round {rnd + 1}: {shape} batch {batch} {mode} ...", file=sys.stderr, flush=True)
                load_before = os.getloadavg()[0]
                if mode.startswith("opacus") and importlib.util.find_spec("opacus") is None:
                    res = {"status": "infeasible", "reason": "opacus is not installed (the bench extra: "
                                                             "python -m pip install -e \".[bench]\")"}
                else:
                    res = h.run_child(__file__, spec, step_limit=args.step_limit)
                res["load_average_1min"] = [load_before, os.getloadavg()[0]]
                res["round"] = rnd + 1
                print(f"    -> {res['status']}: "
                      + (f"{res['step_seconds_median']:.3f} s, {h.mib(res['memory']['bytes'])} MiB"
                         if res["status"] == "ok" else str(res.get("reason"))), file=sys.stderr, flush=True)
                rounds.setdefault(key, []).append(res)

    runs = []
    for shape, batch, reduced in todo:
        for mode in modes:
            runs.append(_combine(shape, batch, reduced, mode, rounds[(shape, batch, mode)]))

    ratios = []
    for shape, batch, reduced in todo:
        by = {r["mode"]: r for r in runs if r["shape"] == shape and r["batch"] == batch and r["status"] == "ok"}

        def t(m, key="step_seconds_median", by=by):
            return by[m][key] if m in by else None

        def m_(m, by=by):
            return by[m]["memory"]["bytes"] if m in by else None

        q = {"shape": shape, "batch": batch, "reduced": reduced}
        for name, a, b in (("ours_over_nonprivate", "ours", "non-private"),
                           ("chunked_over_nonprivate", "ours-4chunks", "non-private"),
                           ("opacus_over_ours", "opacus", "ours"), ("ghost_over_ours", "opacus-ghost", "ours")):
            q[name + "_time"] = _ratio(t(a), t(b))
            q[name + "_time_of_minimums"] = _ratio(t(a, "step_seconds_min"), t(b, "step_seconds_min"))
            q[name + "_memory"] = _ratio(m_(a), m_(b))
        noise = by["ours"].get("noise_seconds_median") if "ours" in by else None
        q["noise_draw_seconds"] = noise
        q["ours_over_nonprivate_plus_noise_time"] = _ratio(t("ours"), None if noise is None or t("non-private") is None
                                                           else t("non-private") + noise)
        ratios.append(q)

    result = {"device": h.describe_device(args.device), "device_arg": args.device,
              "machine": {**h.machine(), "torch_threads": args.threads or torch.get_num_threads()},
              "versions": h.versions(), "quick": args.quick, "settings": settings(args),
              "targets": TARGETS,
              "runs": runs, "ratios": ratios}
    print(h.save_results(args.out, stem, result, _markdown))


def _fmt(x, spec=".2f", unit=""):
    return "-" if x is None else f"{x:{spec}}{unit}"


def _mark(x, ok) -> str:
    if x is None:
        return "n/a"
    return f"{x:.2f}x {'(met)' if ok(x) else '(missed)'}"


def _lowest(q: dict) -> float | None:
    """(non-private + noise draw) / non-private: the lowest time ratio the step's own work allows."""
    ours, floor = q.get("ours_over_nonprivate_time"), q.get("ours_over_nonprivate_plus_noise_time")
    return None if ours is None or floor is None else ours / floor


def _markdown(r: dict) -> str:
    v, st = r["versions"], r["settings"]["values"]
    lines = [
        "# DP-SGD step benchmark",
        "",
        f"Device: **{r['device']}** ({r['machine']['cpus']} CPUs, "
        f"{_fmt(r['machine']['memory_bytes'] and r['machine']['memory_bytes'] / 2**30, '.0f')} GiB RAM). "
        f"torch {v['torch']}, opacus {v['opacus']}, Python {v['python']}."
        + (" **Quick run.**" if r["quick"] else ""),
        "",
        f"One training step per (shape, batch, mode), each mode in a fresh process; median of at least "
        f"{st['steps']} timed steps (up to {st['max_steps']} for fast steps, fewer for steps over "
        f"{st['timed_budget_seconds'] / st['steps']:.0f} s) after {st['warmup']} warm-up, torch threads "
        f"{st['torch_threads'] or r['machine'].get('torch_threads')}. "
        + (f"Each mode whose first median was under {st['repeat_below_seconds']:.0f} s was measured in "
           f"{st['rounds']} rounds (fresh processes, mode order rotated); the table shows the lowest "
           "round median (all of them in the JSON), the minimum over all rounds' steps and the largest peak "
           "memory. " if st["rounds"] > 1 else "")
        + "Memory: "
        + ("CUDA max_memory_allocated above the pre-model level." if r["device_arg"].startswith("cuda") else
           "process peak RSS minus the RSS before the model and inputs were built; 'torch peak' is the "
           "CPU allocator's peak during one step above its level at the step's start (profiler memory "
           "events; parameters, inputs and optimizer state excluded).")
        + f" A mode that needs more than {st['step_limit_seconds']:.0f} s for a step or runs out of "
        "memory is listed as infeasible with the reason. Rows marked *reduced* use 5k-row tables so that "
        "Opacus's default mode fits; they are not the paper's shapes.",
        "",
        ""
        if r["device_arg"].startswith("cuda") else
        "The machine is shared (other jobs ran on its cores during the run; the 1-minute load average "
        "before/after each mode and round is in the table), so wall times are noisy: the median is the headline "
        "and the minimum is shown next to it. With 2 torch threads on this 2-core machine any other busy "
        "process stalls every parallel region (steps 5-10x slower, at random), hence the run with --threads 1.",
        "",
        "| shape | batch | mode | step median (s) | step min (s) | peak memory (MiB) | torch peak (MiB) | load "
        "| status |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in r["runs"]:
        label = row["shape"]
        load = "/".join(f"{x:.1f}" for x in row.get("load_average_1min", []))
        if row["status"] == "ok":
            torch_peak = row.get("torch_step_peak_bytes")
            lines.append(f"| {label} | {row['batch']:,} | {row['mode']} | {row['step_seconds_median']:.3f} | "
                         f"{row['step_seconds_min']:.3f} | {h.mib(row['memory']['bytes'])} | {h.mib(torch_peak)} | "
                         f"{load} | ok ({row['timed_steps']} timed steps, round medians "
                         f"{', '.join(f'{x:.3f}' for x in row['round_medians'])}) |")
        else:
            why = str(row.get("reason"))
            if row.get("error"):
                why += f" ({row['error'][:160]})"
            if row.get("opacus_per_sample_gradient_bytes_estimate"):
                gib = row["opacus_per_sample_gradient_bytes_estimate"] / 2**30
                why += f"; per-sample gradients alone: ~{gib:,.0f} GiB"
            lines.append(f"| {label} | {row['batch']:,} | {row['mode']} | - | - | - | - | {load} | infeasible: "
                         f"{why.replace('|', '/').replace(chr(10), ' ')} |")
    lines += ["", (f"Ratios (same shape and batch; targets: ours / non-private <= {TIME_TARGET} in time and "
              f"<= {MEMORY_TARGET} in memory, Opacus / ours >= {PEER_TARGET:g}); time "
              "ratios of the medians, with the ratio of the minimums in brackets. 'noise draw' is the time to draw "
              "the step's noise alone (one standard normal per parameter, measured in the ours process after its "
              "steps): ours / (non-private + noise draw) is the step against what no DP-SGD step can go below, "
              "and 'lowest possible' is (non-private + noise draw) / non-private, the time ratio of a step that "
              "did nothing but the non-private step and the noise: where it is above the time target, the "
              "target is out of reach of the step's own work:"), "",
              ("| shape | batch | ours/non-private time | noise draw (s) | lowest possible | "
               "ours/(non-private + noise draw) time | ours/non-private memory | ours 4 chunks/non-private time | "
               "ours 4 chunks/non-private memory | opacus/ours time | opacus/ours memory | ghost/ours time | "
               "ghost/ours memory |"),
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    time_ok, memory_ok, peer_ok = ((lambda x: x <= TIME_TARGET), (lambda x: x <= MEMORY_TARGET),
                                   (lambda x: x >= PEER_TARGET))
    for q in r["ratios"]:
        cells = []
        for name, ok_time, ok_memory in (("ours_over_nonprivate", time_ok, memory_ok),
                                         ("chunked_over_nonprivate", time_ok, memory_ok),
                                         ("opacus_over_ours", peer_ok, peer_ok), ("ghost_over_ours", peer_ok, peer_ok)):
            if name + "_time" not in q:
                cells += ["n/a", "n/a"]
                continue
            tm = _mark(q[name + "_time"], ok_time)
            if q[name + "_time_of_minimums"] is not None:
                tm += f" [{q[name + '_time_of_minimums']:.2f}x]"
            cells += [tm, _mark(q[name + "_memory"], ok_memory)]
        # the noise floor beside ours / non-private time (absent from files made before it was measured)
        floor, lowest = q.get("ours_over_nonprivate_plus_noise_time"), _lowest(q)
        cells[1:1] = [_fmt(q.get("noise_draw_seconds"), ".4f"), "-" if lowest is None else f"{lowest:.2f}x",
                      "-" if floor is None else f"{floor:.2f}x"]
        lines.append(f"| {q['shape']} | {q['batch']:,} | " + " | ".join(cells) + " |")
    lines += ["", "n/a: one side of the ratio was infeasible (see the first table). 'ours 4 chunks' is the same "
              "logical batch clipped in four fixed-size chunks whose clipped sums add before the single noise draw "
              "(DPSGDSettings.padded_size = batch / 4): a performance setting that trades a little time for "
              "memory and changes no guarantee.", "", h.settings_markdown(r["settings"])]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main(sys.argv[1:])
