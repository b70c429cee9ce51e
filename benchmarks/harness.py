"""Shared pieces of the benchmarks.

For every benchmark, the ``settings`` object of its results file (:func:`settings_record`):
every setting that produced the results, resolved (defaults included, library defaults
read from the library), beside the command line and the commit that ran. Each script's
``settings(args)`` builds it both when it writes results and when asked what it would use
today, so tests/test_benchmark_settings.py can tell a stale results file from a current one
(:func:`settings_differences`) without running anything. A script whose results cannot be
made again soon pins the settings it was measured at instead of reading the library's
defaults: :func:`without_rr` leaves out of its record trainer settings that came later and
that its runs never read, and :func:`as_planned_then` plans its recorded scenario as it was
planned before later planner defaults.

For the benchmarks trained on synthetic data with held-out users: :func:`holdout_data`
(``HOLDOUT``) and :func:`eval_metrics`.

For the trainer benchmarks (``dpsgd_step.py``, ``epoch_throughput.py``):

- the model shapes (Criteo pCTR and Criteo attribution, as in the Hybrid paper, and reduced
  variants that fit Opacus's per-sample gradients in memory);
- synthetic inputs of those shapes (ids uniform over each table, Bernoulli(0.25) labels);
- a child-process runner: every measurement runs in a fresh interpreter, which reports JSON
  events on stdout (``ready``, one per ``step``, ``done`` or ``error``) and is killed when
  it goes quiet for longer than the step time limit, so that one mode's peak memory never
  includes another's and an infeasible mode becomes a recorded failure, not a crash;
- memory probes: the process RSS (current and peak) on CPU, the CUDA allocator on CUDA, and
  torch's own CPU allocator view (profiler memory events) for one step.

Not a benchmark by itself.
"""

from __future__ import annotations

import json
import os
import platform
import queue
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
ROOT = Path(__file__).resolve().parent.parent


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def settings_record(script: str, argv: list[str], values: dict) -> dict:
    """The ``settings`` object a results file records.

    Args:
        script: the benchmark's file name (``utility_frontier.py``).
        argv: the command-line arguments it was given (the test re-parses them).
        values: every setting that produced the results, resolved; JSON-plain after a round
            trip (tuples become lists), so that a fresh object and one read back compare equal.

    The commit (and whether the work tree had uncommitted changes to tracked files outside
    the results) and the budgetplan version say which code ran; they are provenance, not
    settings, and :func:`settings_differences` leaves them out. In a copy of the tree without its
    git directory they are read from the environment (``PROVENANCE``), else None.
    """
    import budgetplan

    commit = _git("rev-parse", "HEAD")
    # results files are outputs: rewriting them is no change to the code that ran
    status = _git("status", "--porcelain", "--untracked-files=no", "--", ".", ":!benchmarks/results")
    dirty = None if status is None else bool(status)
    if commit is None:  # a copy of the tree without its git directory (a GPU machine's): what was recorded beside it
        given = json.loads(os.environ.get(PROVENANCE) or "{}")
        commit, dirty = given.get("commit"), given.get("dirty")
    return {"script": script, "argv": [str(a) for a in argv], "values": json.loads(json.dumps(values)),
            "commit": commit, "dirty": dirty, "budgetplan_version": budgetplan.__version__}


# Where the tree is a copy without its git directory, the commit and dirty flag it was copied at, as
# JSON ({"commit": ..., "dirty": ...}), recorded beside the copy by benchmarks/gpu_suite.py --prepare.
PROVENANCE = "BENCHMARK_PROVENANCE"


def settings_differences(recorded: dict, today: dict) -> list[str]:
    """The settings (dotted names under ``values``) that differ between two settings objects.

    A setting present in one and absent from the other differs too; provenance (commit,
    version, argv) is not compared.
    """
    out: list[str] = []
    if recorded.get("script") != today.get("script"):
        out.append("script")

    def walk(a, b, name):
        if isinstance(a, dict) and isinstance(b, dict):
            for key in sorted(set(a) | set(b)):
                walk(a.get(key, _ABSENT), b.get(key, _ABSENT), f"{name}.{key}" if name else key)
        elif a != b or type(a) is not type(b) and not {type(a), type(b)} <= {int, float}:
            out.append(name)

    walk(recorded.get("values", {}), today.get("values", {}), "")
    return out


_ABSENT = object()


# TrainSettings' fields that only an RR phase reads: its weight decay, and its stopping rule, (learning
# rate, L2) pairs, weight average and score (read only where the plan holds units out of the RR
# phase: [rr].validation_fraction).
RR_TRAINING = ("rr_checks_per_epoch", "rr_patience", "rr_weight_decay", "rr_candidates", "rr_average",
               "rr_select")


def without_rr(training: dict) -> dict:
    """``TrainSettings.to_dict()`` less the RR phase's settings (``RR_TRAINING``): the training
    settings of runs that never read them."""
    return {k: v for k, v in training.items() if k not in RR_TRAINING}


def as_planned_then(scenario: str) -> str:
    """A scenario recorded before three planner defaults changed, with all three off: the text that plans
    today what the recorded one planned when it was measured.

    - ``[calibration]`` was opt-in (before commit 7554e58); absent, a DP-SGD or Hybrid plan is
      calibrated now. A text without the table gets ``[calibration] share = 0``.
    - The RR phase held no units out (before commit 30be4cc); absent, ``[rr].validation_fraction``
      holds out a share now. An ``[rr]`` table without the key gets ``validation_fraction = 0``.
    - The phases' epsilons added up to the budget (before ``[accounting].composition = "auto"``
      became the default); absent, phases that compose by PLD are planned to their PLD
      total now. A text without the key gets ``composition = "basic"``.

    What a text states is kept. The recorded text stays the record: it is what was planned then.
    """
    import tomllib

    from budgetplan.scenario.examples import set_key

    raw = tomllib.loads(scenario)
    if "rr" in raw and "validation_fraction" not in raw["rr"]:
        scenario = set_key(scenario, "rr", "validation_fraction", 0)
    if "calibration" not in raw:
        scenario = scenario.rstrip("\n") + "\n[calibration]\nshare = 0\n"
    if "composition" not in raw.get("accounting", {}):
        if "accounting" not in raw:
            scenario = scenario.rstrip("\n") + "\n[accounting]\n"
        scenario = set_key(scenario, "accounting", "composition", "basic")
    return scenario


def clear_pld_caches() -> None:
    """Empty every cache of the PLD engine (``fastpld`` and ``mixture_pld``: the Gaussian, RR and mixture
    PMFs), so that a timed calibration reuses nothing. Found by what is cached, not by name: the
    mixture PMFs moved out of ``fastpld`` once and left the benchmarks clearing a name that was gone."""
    from budgetplan.accounting import fastpld, mixture_pld

    for module in (fastpld, mixture_pld):
        for value in list(vars(module).values()):
            if callable(getattr(value, "cache_clear", None)):
                value.cache_clear()


# The users the benchmarks on synthetic data hold out for evaluation (holdout_data).
HOLDOUT = "users whose id * 0x9E3779B97F4A7C15 (mod 2^64) is 0 mod 5"


def holdout_data(shape: str, seed: int, rows: int, users: int, work: Path) -> tuple[Path, Path, int]:
    """``rows`` synthetic rows of ``shape`` by ``users`` users (data seed 1000 + ``seed``), the users
    ``HOLDOUT`` names written apart: (training file, evaluation file, training rows N)."""
    import numpy as np
    import pyarrow.parquet as pq

    from trainers.data.synth import get_shape, synthesize

    spec = get_shape(shape).features
    table = synthesize(rows, users, 1000 + seed, shape=shape)
    ids = table.column(spec.unit_id).to_numpy().astype(np.uint64)
    held = (ids * np.uint64(0x9E3779B97F4A7C15)) % np.uint64(5) == 0
    root = work / f"{shape}-{seed}"
    root.mkdir(parents=True, exist_ok=True)
    pq.write_table(table.filter(~held), root / "train.parquet")
    pq.write_table(table.filter(held), root / "eval.parquet")
    return root / "train.parquet", root / "eval.parquet", int((~held).sum())


def eval_metrics(record) -> dict:
    """A run record's evaluation: AUC, log loss, calibration ratio, relative AUC loss, beats-baseline flag."""
    ev = record.metrics["eval"]
    return {k: ev.get(k) for k in ("auc", "log_loss", "calibration_ratio", "relative_auc_loss", "beats_baseline")}


def mean_std(values, digits: int) -> str:
    """``mean +- std`` of the values that are not None, to ``digits`` places (one value: the mean
    alone; none: ``-``)."""
    import statistics

    values = [v for v in values if v is not None]
    if not values:
        return "-"
    text = f"{statistics.fmean(values):.{digits}f}"
    return text + (f" +- {statistics.stdev(values):.{digits}f}" if len(values) > 1 else "")


def by_shape_and_epsilon(cells: list[dict]) -> dict:
    """The cells grouped by (shape, epsilon), in the order first seen."""
    groups: dict = {}
    for c in cells:
        groups.setdefault((c["shape"], c["epsilon"]), []).append(c)
    return groups


def apply_quick(args, argv: list[str], quick: dict) -> None:
    """With ``--quick``: ``quick``'s value for every option (``--<key>``) the command line did not give."""
    if args.quick:
        _preset(args, argv, quick)


def _preset(args, argv: list[str], values: dict) -> None:
    given = {a.split("=")[0] for a in argv}
    for key, value in values.items():
        if f"--{key.replace('_', '-')}" not in given:
            setattr(args, key, value)


SMOKE_HELP = ("the smallest run of the script's real code path, every branch at a tiny size (what "
              "tests/test_benchmark_smoke.py runs): it measures nothing; needs --out")


def add_smoke(parser, *, out: bool = False) -> None:
    """``--smoke`` (:func:`apply_smoke`), and ``--out DIR`` (default ``RESULTS``) where the script has none."""
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    if out:
        parser.add_argument("--out", type=Path, default=RESULTS, help="results folder (default benchmarks/results)")


def apply_smoke(parser, args, argv: list[str], smoke: dict) -> None:
    """With ``--smoke``: ``smoke``'s value for every option (``--<key>``, underscores as dashes) the
    command line did not give. A smoke run writes under an ``--out`` it was given, never over the
    committed results."""
    if not args.smoke:
        return
    if not any(a.split("=")[0] == "--out" for a in argv):
        parser.error("--smoke needs --out DIR: a smoke run never writes over benchmarks/results")
    _preset(args, argv, smoke)


def run_and_save(args, run, render) -> dict:
    """``run(args)``, its results saved as ``args.out/args.name`` (.json and .md) and the table printed."""
    result = run(args)
    print(save_results(args.out, args.name, result, render))
    return result


def save_results(out: Path, name: str, result: dict, render) -> str:
    """Write ``out/name.json`` (the result) and ``out/name.md`` (``render(result)``), atomically;
    returns the markdown."""
    from budgetplan.util.fileio import write_atomic

    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / f"{name}.json", json.dumps(result, indent=2) + "\n")
    text = render(result)
    write_atomic(out / f"{name}.md", text)
    return text


class LogProgress:
    """``rich.progress.Progress``'s ``add_task``, ``update`` and ``advance`` as plain lines on
    stderr, for a benchmark whose stderr is a log or a pipe (a rich bar there shows nothing
    until it ends): one line when a task starts, each time its description changes and each
    time it advances, with how far it is and how long it has run."""

    def __init__(self, stream=None, clock=time.monotonic):
        self._stream, self._clock = stream, clock
        self._tasks: list[dict] = []

    def __enter__(self) -> LogProgress:
        return self

    def __exit__(self, *exc) -> None:
        return None

    def add_task(self, description: str, total: int | None = None, **_) -> int:
        self._tasks.append({"description": description, "total": total, "done": 0, "start": self._clock()})
        self._line(len(self._tasks) - 1, "started")
        return len(self._tasks) - 1

    def update(self, task: int, *, description: str | None = None, advance: float = 0, **_) -> None:
        if description is not None and description != self._tasks[task]["description"]:
            self._tasks[task]["description"] = description
            self._line(task, "now")
        if advance:
            self.advance(task, advance)

    def advance(self, task: int, advance: float = 1) -> None:
        self._tasks[task]["done"] += advance
        self._line(task, "advanced")

    def _line(self, task: int, what: str) -> None:
        from trainers.progress import PREFIX

        t = self._tasks[task]
        done = f"{t['done']:g}" + (f"/{t['total']:g}" if t["total"] else "")
        print(f"{PREFIX}{t['description']}: {what}, {done} done, {self._clock() - t['start']:.0f} s elapsed",
              file=self._stream or sys.stderr, flush=True)


def progress(*columns):
    """A rich progress bar on stderr in a terminal, :class:`LogProgress` lines otherwise."""
    if not sys.stderr.isatty():
        return LogProgress()
    from rich.console import Console
    from rich.progress import Progress

    return Progress(*columns, console=Console(stderr=True))


def work_folder(device: str, work: Path | None, *, script: str) -> Path:
    """The scratch folder of a benchmark that trains on ``device``: ``work``, or a fresh temporary one,
    made only after the device is known to exist (``--device cuda`` where there is none ends the
    script first, naming it, with nothing written)."""
    import tempfile

    from budgetplan.errors import InvalidParameterError
    from trainers.run import resolve_device

    try:
        resolve_device(device)
    except InvalidParameterError as exc:
        raise SystemExit(f"{script}: {exc}") from None
    folder = work or Path(tempfile.mkdtemp(prefix=f"{script.replace('_', '-')}-"))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def dpsgd_scenario(name: str, *, epsilon: float, rows: int, batch: int, shape: str) -> str:
    """A one-epoch DP-SGD scenario (replace-one per impression, delta 0.1/N, C = 5) over a synthetic
    shape's features: what the paper-size and reproduction benchmarks plan."""
    from trainers.data.synth import get_shape

    return f"""name = "{name}"
[budget]
epsilon = {float(epsilon)!r}
delta = "0.1/N"
[privacy]
adjacency = "replace-one"
unit = "impression"
[data]
dataset_size = {rows}
[algorithm]
name = "dpsgd"
[dpsgd]
batch_size = {batch}
epochs = 1
clipping_norm = 5.0
{get_shape(shape).features.to_toml()}"""


def settings_markdown(settings: dict) -> str:
    """One paragraph for a results table: how to re-run it, the commit, and every setting."""
    import json as _json

    def flat(d, prefix=""):
        for k, v in d.items():
            if isinstance(v, dict):
                yield from flat(v, f"{prefix}{k}.")
            else:
                yield f"{prefix}{k} = {_json.dumps(v)}"

    commit = (settings.get("commit") or "unknown")[:12] + (" (uncommitted changes)" if settings.get("dirty") else "")
    command = " ".join(["python", f"benchmarks/{settings['script']}", *settings["argv"]])
    version = settings.get("budgetplan_version")
    head = f"Settings (`{command}`, commit {commit}" + (f", budgetplan {version}" if version else "")
    if settings.get("reconstructed"):
        head += f"; reconstructed: {settings['reconstructed']}"
    return head + "): " + "; ".join(flat(settings["values"])) + "."

# TwoTowerMLP keyword arguments per shape.
SHAPES = {
    # Criteo pCTR as in arXiv:2401.15246: 13 numeric + 26 categorical features, split into
    # 20 non-sensitive (7 numeric + 13 categorical) and 19 sensitive (6 + 13) columns,
    # embedding 32, tower 598, common (598, 598), hashed vocabularies 100k / 50k.
    "pctr": {"ns_vocab": 100_000, "n_ns_cat": 13, "n_ns_num": 7, "s_vocab": 50_000, "n_s_cat": 13, "n_s_num": 6,
             "embedding_dim": 32, "tower_hidden": 598, "common_hidden": (598, 598)},
    # Criteo attribution: embedding 8, tower 128, common (128, 64); vocabularies chosen so the
    # model has about 0.5M parameters (464k in the tables, 35k in the Linear layers).
    "attribution": {"ns_vocab": 40_000, "n_ns_cat": 6, "n_ns_num": 2, "s_vocab": 18_000, "n_s_cat": 4,
                    "n_s_num": 0, "embedding_dim": 8, "tower_hidden": 128, "common_hidden": (128, 64)},
}
# Reduced shapes: the same layers with 5k-row tables, so that Opacus's default mode (which
# materialises batch x vocabulary x dim per-sample gradients) fits in memory.
SHAPES["pctr-reduced"] = {**SHAPES["pctr"], "ns_vocab": 5_000, "s_vocab": 5_000}
SHAPES["attribution-reduced"] = {**SHAPES["attribution"], "ns_vocab": 5_000, "s_vocab": 5_000}


def versions() -> dict:
    import numpy
    import torch

    out = {"python": platform.python_version(), "torch": torch.__version__, "numpy": numpy.__version__}
    try:
        from importlib.metadata import version

        out["opacus"] = version("opacus")
    except Exception:  # noqa: BLE001 - not installed: the Opacus rows say so
        out["opacus"] = None
    return out


def results_name(base: str, device: str) -> str:
    """The results file's stem for a run on ``device``: ``base`` on the CPU, ``base_cuda`` on a
    GPU, so that a GPU run sits beside the CPU figures instead of replacing them."""
    kind = device.split(":", 1)[0]
    return base if kind == "cpu" else f"{base}_{kind}"


def describe_device(device: str) -> str:
    import torch

    if device.startswith("cuda"):
        return f"CUDA {torch.cuda.get_device_name(torch.device(device))}"
    model = platform.processor() or "cpu"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"CPU {model}, {os.cpu_count()} cores"


def machine() -> dict:
    mem = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                mem = int(line.split()[1]) * 1024
    except OSError:
        pass
    return {"platform": platform.platform(), "cpus": os.cpu_count(), "memory_bytes": mem}


def mem_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def current_rss() -> int:
    """The process's resident set size now, in bytes (Linux)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


def peak_rss() -> int:
    """The process's maximum RSS so far, in bytes (ru_maxrss is KiB on Linux)."""
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def apply_allocator(spec: dict) -> bool:
    """In a child: glibc's allocator as ``spec["allocator"]`` says ("tuned": ``tune_allocator``, what
    ``budgetplan train`` does; "system" or None: as it is). False, with an error event sent, when
    "tuned" cannot be applied here (not glibc, the opt-out, or the environment sets the allocator itself)."""
    if spec.get("allocator") != "tuned":
        return True
    from trainers.allocator import tune_allocator

    if tune_allocator():
        return True
    emit("error", reason="error", message="--allocator tuned: glibc's allocator cannot be set in this process "
                                          "(another C library, BUDGETPLAN_ALLOCATOR=system, or MALLOC_* / "
                                          "LD_PRELOAD in the environment)")
    return False


def limit_address_space(fraction: float = 0.85) -> int | None:
    """Cap this (child) process's address space at its current size + ``fraction`` of free memory.

    An allocation beyond it then raises a clean out-of-memory error inside torch instead of
    the kernel's OOM killer picking a victim. CPU only (CUDA reserves large virtual ranges).
    """
    free = mem_available()
    if free is None:
        return None
    try:
        vm = int(Path("/proc/self/statm").read_text().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return None
    cap = vm + int(fraction * free)
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    return cap


def synthetic_inputs(cfg: dict, rows: int, device, seed: int = 0):
    """(ns_cat, ns_num, s_cat, s_num, label) of ``rows`` synthetic rows for a TwoTowerMLP config."""
    import torch

    g = torch.Generator(device="cpu").manual_seed(seed)
    ns_cat = torch.randint(cfg["ns_vocab"], (rows, cfg["n_ns_cat"]), generator=g)
    ns_num = torch.randn(rows, cfg["n_ns_num"], generator=g)
    s_cat = torch.randint(cfg["s_vocab"], (rows, cfg["n_s_cat"]), generator=g)
    s_num = torch.randn(rows, cfg["n_s_num"], generator=g)
    label = (torch.rand(rows, generator=g) < 0.25).float()
    return tuple(t.to(device) for t in (ns_cat, ns_num, s_cat, s_num, label))


def sync(device) -> None:
    import torch

    if str(device).startswith("cuda"):
        torch.cuda.synchronize(torch.device(device))


class Memory:
    """Peak memory of a child run above its level before the model was built."""

    def __init__(self, device: str):
        import torch

        self.cuda = device.startswith("cuda")
        self.device = device
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(torch.device(device))
            self.base = torch.cuda.memory_allocated(torch.device(device))
        else:
            self.base = current_rss()

    def report(self) -> dict:
        import torch

        if self.cuda:
            peak = torch.cuda.max_memory_allocated(torch.device(self.device))
            return {"kind": "cuda max_memory_allocated minus allocated before the model",
                    "bytes": int(peak - self.base), "baseline_bytes": int(self.base)}
        peak = peak_rss()
        return {"kind": "process max RSS (getrusage) minus RSS before the model", "bytes": int(peak - self.base),
                "baseline_bytes": int(self.base), "max_rss_bytes": int(peak)}


def torch_cpu_step_peak(step) -> int | None:
    """Torch's own view on CPU: peak bytes its allocator held during one ``step()``, above the start.

    From the profiler's memory events (every allocation and free, in time order); tensors alive
    before the step (parameters, optimizer state, inputs) are not counted. None if unavailable.
    """
    try:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            step()
        events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
                        if e.name() == "[memory]")
    except Exception:  # noqa: BLE001 - a profiler that cannot do it: report nothing
        return None
    cur = peak = 0
    for _, nbytes in events:
        cur += nbytes
        peak = max(peak, cur)
    return int(peak)


def emit(event: str, **fields) -> None:
    """One event line from a child to its parent."""
    print(json.dumps({"event": event, **fields}), flush=True)


def run_child(script: str, spec: dict, *, step_limit: float, build_limit: float = 300.0) -> dict:
    """Run ``python script --child SPEC`` and collect its events.

    Returns ``{"status": "ok", **done fields}`` or ``{"status": "infeasible", "reason": ...}``:
    the child is killed if it takes more than ``build_limit`` s to report ``ready`` or more than
    ``step_limit`` s between two later events (one step), or it reports an error, or it dies.
    """
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    cmd = [sys.executable, script, "--child", json.dumps(spec)]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    lines: queue.Queue = queue.Queue()
    err: list[str] = []

    def pump_out():
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    def pump_err():
        for line in proc.stderr:
            err.append(line)
            del err[:-40]

    threading.Thread(target=pump_out, daemon=True).start()
    threading.Thread(target=pump_err, daemon=True).start()
    steps: list[dict] = []
    ready = None
    result: dict | None = None
    while True:
        limit = step_limit if ready is not None else build_limit
        try:
            line = lines.get(timeout=limit)
        except queue.Empty:
            proc.kill()
            proc.wait()
            what = "one step" if ready is not None else "building the model and inputs"
            result = {"status": "infeasible", "reason": f"time limit: {what} took more than {limit:.0f} s "
                      f"(after {len(steps)} completed steps); killed"}
            break
        if line is None:
            break
        try:
            ev = json.loads(line)
        except json.JSONDecodeError:
            continue
        if ev.get("event") == "ready":
            ready = ev
        elif ev.get("event") == "step":
            steps.append(ev)
        elif ev.get("event") == "done":
            result = {"status": "ok", **{k: v for k, v in ev.items() if k != "event"}}
        elif ev.get("event") == "error":
            result = {"status": "infeasible", "reason": ev.get("reason"), "error": ev.get("message")}
    rc = proc.wait()
    if result is None:
        result = _died(rc, err)
    result["wall_seconds"] = time.perf_counter() - t0
    result["steps_seen"] = len(steps)
    if ready is not None:
        result.setdefault("ready", {k: v for k, v in ready.items() if k != "event"})
    return result


def _died(rc: int, err: list[str]) -> dict:
    """A child that exited (status ``rc``, the tail of its stderr ``err``) without a result."""
    if rc < 0:
        why = f"killed by signal {-rc}" + (" (SIGKILL: most likely the out-of-memory killer)" if rc == -9 else "")
    else:
        why = f"exited with status {rc} without a result"
    tail = "".join(err[-5:]).strip()
    return {"status": "infeasible", "reason": why, "error": tail[-600:] or None}


def failure_reason(exc: BaseException) -> str:
    """A short classification of an exception raised by a measured step."""
    text = f"{type(exc).__name__}: {exc}"
    low = text.lower()
    if isinstance(exc, MemoryError) or "out of memory" in low or "can't allocate memory" in low \
            or "not enough memory" in low or "cannot allocate memory" in low or "outofmemory" in low:
        return "out of memory"
    return "error"


def mib(n) -> str:
    return "-" if n is None else f"{n / 2**20:,.0f}"
