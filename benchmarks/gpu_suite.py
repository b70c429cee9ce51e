"""Everything issue 27 item 3 measures on a GPU, in one prepared run that fits a short device lease.

Here, where git and the project's environment are (once per lease, before the device call)::

    python benchmarks/gpu_suite.py --prepare

copies the pure-Python packages the GPU machine's image lacks (``PREPARED``: Opacus, the
``bench`` extra, and the accounting peers budgetplan imports) from this environment, with the
commit and whether the tree has uncommitted changes, into ``.gpu-suite/`` (ignored by git). On
the GPU machine, with ``.gpu-suite`` carried and ``timeout_s`` 600::

    PYTHONUNBUFFERED=1 python3 benchmarks/gpu_suite.py "$OUT"

``--dry-run`` prints the steps and their commands and runs nothing; ``--device cpu --smoke``
runs every step at its smallest size on a CPU (about 3 minutes on 2 cores); ``--only`` and
``--skip`` (comma-separated step names) rerun a part; ``--budget`` is the wall time in seconds
(default ``BUDGET``).

The steps, in order. The device check runs first and stops everything, with exit status 2 and
a one-line reason, when there is no CUDA device or a required package is missing. The
*concurrent* steps then start together (none is a timing: the 40M-row data is generated while
the tests run); the *timed* steps run one at a time after all of them ended, each alone on the
machine. Each step has its own time limit (its cap, or what is left of the budget if less); a
step with less than half its estimate left is skipped, and a step that fails, times out or is
skipped leaves the others running. The estimates (seconds on an H100) come from the existing
results:

Step (kind; estimate / cap in seconds): what it runs, and where the estimate comes from.

- ``device`` (first; 10 / 60): nvidia-smi, ``torch.cuda.get_device_name``, the packages; one
  interpreter importing torch.
- ``synth`` (concurrent; 100 / 300): ``data synth --shape pctr``, 40,000,000 rows of 8,000,000
  users, for ``paper``. 102 s on the 2-core machine (results/data_scale.md); one process.
- ``gpu-tests`` (concurrent; 90 / 180): every test file marked ``gpu`` (tests/trainers/test_gpu.py:
  the README's Hybrid plan on 200,000 rows trained with ``--device cuda`` and audited, seeded
  runs, the clipped sum against the CPU's). Never timed on a GPU; the same walk-through is a
  slow test (15 s or more) on the CPU.
- ``reproduction`` (concurrent; 45 / 150): benchmarks/reproduction.py, three 50,000-row DP-SGD
  trainings from seeds 7, 7 and 8 compared file by file. 38 s on the 2-core machine at 2,000
  rows: each CLI call is mostly imports.
- ``epoch`` (timed; 60 / 150): benchmarks/epoch_throughput.py, 20 steps at batch 16,384 per shape
  and mode, the WALR release against the device's bandwidth. The four children of
  results/epoch_throughput_cuda.json took 10-16 s each (H100), the release 0.006 s.
- ``step`` (timed; 120 / 240): benchmarks/dpsgd_step.py, one round: pCTR and attribution at 4,096
  and 16,384 rows, non-private, ours (one chunk) and Opacus ghost: 12 children of about 10 s
  (an interpreter, CUDA's start, at most 50 timed steps), as the epoch children.
- ``paper`` (timed; 180 / 300): benchmarks/paper_sizes.py over the 40M rows: plan, train (read,
  encode, one DP-SGD epoch), audit, with the peak GPU memory. On 2 CPU cores
  (results/paper_sizes.md) read took 13 s, encode 70 s, DP-SGD 272 s, the audit 17 s; the H100
  trained the attribution-sized model at 560,000 rows/s in 4,096-row chunks
  (results/epoch_throughput_cuda.md): 71 s or less for 40M rows.

About 470 s in all (10 + 100 + 60 + 120 + 180). ``paper`` needs ``synth`` to have passed.

What comes back, under the output folder (the device tool returns at most 8 files there):
``suite.log`` (every step's start and end, status, seconds, limit and peak GPU memory by
``nvidia-smi``: the device's, so the concurrent steps' together; the end of a failed step's
log), ``suite.json`` (the same, and the device) and ``results.tar.gz``: ``results/`` (the
``*_cuda.json`` and ``.md`` files the steps wrote, to copy into ``benchmarks/results/``),
``logs/`` (each step's output), ``device.txt`` and the paper run's and the reproduction's
records and logs. All three are rewritten after every step,
so a run cut off keeps what it finished. Exit status 0 when every step passed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PREPARED_DIR = ROOT / ".gpu-suite"
# distributions copied by --prepare: the GPU image has torch, numpy, scipy, pyarrow, click, rich,
# psutil and pytest, not these (all pure Python)
PREPARED = ("opacus", "dp-accounting", "prv-accountant")
REQUIRED = ("torch", "numpy", "scipy", "pyarrow", "click", "rich", "psutil", "pytest", "dp_accounting",
            "prv_accountant")
OPTIONAL = ("opacus",)  # the step benchmark's peer: without it its rows say so
BUDGET = 500.0
ROWS = 40_000_000  # the paper's size
SMOKE_ROWS = 2_000  # paper_sizes.py --smoke's
STEP_MODES = "non-private,ours,opacus-ghost"
STEP_SHAPES = "pctr,attribution"
BUNDLE_FILE_LIMIT = 4 << 20  # a larger file stays out of the bundle (its name is listed)
TAIL_LINES = 15


@dataclasses.dataclass(frozen=True)
class Step:
    """One command of the suite; ``estimate`` and ``cap`` in seconds (module docstring)."""

    name: str
    command: tuple[str, ...]
    estimate: float
    cap: float
    timed: bool
    needs: str | None = None


def _python(script: str, *args: str) -> tuple[str, ...]:
    return (sys.executable, f"benchmarks/{script}", *args)


def steps(device: str, smoke: bool, work: Path) -> list[Step]:
    """The suite's steps after the device check, in order (module docstring)."""
    results, data = str(work / "results"), f"{work / 'data'}/"
    rows = SMOKE_ROWS if smoke else ROWS
    small = ("--smoke",) if smoke else ()
    tests = [str(p.relative_to(ROOT)) for p in sorted((ROOT / "tests").rglob("test_*.py"))
             if "pytest.mark.gpu" in p.read_text()]
    return [
        Step("synth", (sys.executable, "-m", "budgetplan", "data", "synth", "--shape", "pctr", "--rows", str(rows),
                       "--users", str(rows // 5), "--out", data, "--json"), 100, 300, timed=False),
        Step("gpu-tests", (sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu", *tests),
             90, 180, timed=False),
        Step("reproduction", _python("reproduction.py", "--device", device, "--out", results, "--work",
                                     str(work / "reproduction"), *small), 45, 150, timed=False),
        Step("epoch", _python("epoch_throughput.py", "--device", device, "--out", results, *small), 60, 150,
             timed=True),
        # --smoke runs its own reduced shape: --shapes would leave it nothing
        Step("step", _python("dpsgd_step.py", "--device", device, "--rounds", "1", "--modes", STEP_MODES,
                             *(() if smoke else ("--shapes", STEP_SHAPES)), "--out", results, *small), 120, 240,
             timed=True),
        Step("paper", _python("paper_sizes.py", "--device", device, "--data", data, "--work", str(work / "paper"),
                              "--out", results, *small), 180, 300, timed=True, needs="synth"),
    ]


def estimate(todo: list[Step]) -> float:
    """Seconds the steps should take: the longest concurrent one, then every timed one."""
    return max((s.estimate for s in todo if not s.timed), default=0) + sum(s.estimate for s in todo if s.timed)


# ----------------------------------------------------------------------------------- the log


class Log:
    """Timestamped lines to stdout and ``suite.log``; ``suite.json`` and the bundle after each step."""

    def __init__(self, out: Path, work: Path, clock=time.monotonic):
        self.out, self.work, self.clock, self.t0 = out, work, clock, clock()
        self.state: dict = {"device": None, "steps": []}
        out.mkdir(parents=True, exist_ok=True)
        self.path = out / "suite.log"

    def line(self, text: str) -> None:
        stamped = f"[{self.clock() - self.t0:6.1f} s] {text}"
        print(stamped, flush=True)
        with open(self.path, "a") as f:
            f.write(stamped + "\n")

    def step_done(self, row: dict) -> None:
        self.state["steps"].append(row)
        gpu = "" if row.get("peak_gpu_mib") is None else f", peak GPU {row['peak_gpu_mib']:,.0f} MiB (nvidia-smi)"
        limit = "" if row.get("limit_seconds") is None else f" of {row['limit_seconds']:.0f} s allowed"
        self.line(f"{row['name']}: {row['status']}" + (f" ({row['reason']})" if row.get("reason") else "")
                  + (f", {row['seconds']:.1f} s{limit}" if row.get("seconds") is not None else "") + gpu)
        if row["status"] != "ok" and row.get("log"):
            for tail in _tail(Path(row["log"]), TAIL_LINES):
                self.line(f"    | {tail}")
        self.save()

    def save(self) -> None:
        self.state["elapsed_seconds"] = self.clock() - self.t0
        _write(self.out / "suite.json", json.dumps(self.state, indent=2) + "\n")
        bundle(self.work, self.out / "results.tar.gz")


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _tail(path: Path, n: int) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()[-n:]
    except OSError:
        return []


def bundle(work: Path, target: Path) -> list[str]:
    """``target``: a tar.gz of the text files under ``work`` (results, logs, records), not the data; returns
    the names of the files left out for their size."""
    left_out = []
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for path in sorted(work.rglob("*")):
            rel = path.relative_to(work)
            if not path.is_file() or rel.parts[0] == "data" or path.suffix not in (".json", ".md", ".log", ".txt",
                                                                                   ".toml", ".jsonl"):
                continue
            if path.stat().st_size > BUNDLE_FILE_LIMIT:
                left_out.append(str(rel))
                continue
            tar.add(path, arcname=str(rel))
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_bytes(buffer.getvalue())
    os.replace(tmp, target)
    return left_out


# ------------------------------------------------------------------------------- GPU memory


class GpuMemory:
    """``nvidia-smi``'s memory used on the device (every process's), sampled every 0.5 s while the suite runs."""

    def __init__(self, enabled: bool):
        self.samples: list[tuple[float, float]] = []
        self.proc = None
        if enabled and shutil.which("nvidia-smi"):
            self.proc = subprocess.Popen(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits",
                                          "-lms", "500"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            try:
                self.samples.append((time.monotonic(), float(line.split(",")[0])))
            except ValueError:
                continue

    def peak(self, start: float, end: float) -> float | None:
        inside = [mib for t, mib in self.samples if start <= t <= end]
        return max(inside) if inside else None

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait()


# ---------------------------------------------------------------------------------- running


class Running:
    """One step's process: its own process group (killed whole at its limit), output to its log."""

    def __init__(self, step: Step, limit: float, logs: Path, env: dict, clock=time.monotonic):
        self.step, self.limit, self.clock = step, limit, clock
        self.log = logs / f"{step.name}.log"
        self.start = clock()
        with open(self.log, "w") as f:
            f.write("$ " + " ".join(step.command) + "\n")
            f.flush()
            self.proc = subprocess.Popen(step.command, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, env=env,
                                         process_group=0)
        self.timed_out = False

    def poll(self) -> bool:
        """Whether it has ended (killed at its limit if it ran past it)."""
        if self.proc.poll() is not None:
            return True
        if self.clock() - self.start > self.limit:
            self.kill()
            self.timed_out = True
            return True
        return False

    def kill(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.proc.wait(timeout=5)
                return
            except subprocess.TimeoutExpired:
                continue

    def row(self, memory: GpuMemory) -> dict:
        end = self.clock()
        status = "timed out" if self.timed_out else ("ok" if self.proc.returncode == 0 else "failed")
        return {"name": self.step.name, "status": status, "returncode": self.proc.returncode,
                "reason": f"killed at its limit of {self.limit:.0f} s" if self.timed_out else
                ("" if status == "ok" else f"exit status {self.proc.returncode}"),
                "seconds": end - self.start, "limit_seconds": self.limit, "estimate_seconds": self.step.estimate,
                "peak_gpu_mib": memory.peak(self.start, end), "log": str(self.log),
                "command": list(self.step.command)}


def run_steps(todo: list[Step], *, log: Log, budget: float, env: dict, memory: GpuMemory,
              clock=time.monotonic, poll_seconds: float = 0.2) -> dict[str, str]:
    """Run ``todo``: the concurrent steps together, then the timed ones one at a time (module docstring);
    returns each step's status."""
    logs = log.work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    deadline = log.t0 + budget
    status: dict[str, str] = {}
    running: list[Running] = []

    def wait() -> None:
        while running:
            for r in [r for r in running if r.poll()]:
                running.remove(r)
                row = r.row(memory)
                status[r.step.name] = row["status"]
                log.step_done(row)
            if running:
                time.sleep(poll_seconds)

    try:
        for step in [s for s in todo if not s.timed]:
            limit = _limit(step, deadline - clock(), log, status)
            if limit is not None:
                log.line(f"{step.name}: started (concurrent, limit {limit:.0f} s): {' '.join(step.command[1:])}")
                running.append(Running(step, limit, logs, env, clock))
        wait()
        for step in [s for s in todo if s.timed]:
            if step.needs is not None and status.get(step.needs) != "ok":
                status[step.name] = "skipped"
                log.step_done({"name": step.name, "status": "skipped",
                               "reason": f"needs {step.needs}, which {status.get(step.needs, 'was not run')}"})
                continue
            limit = _limit(step, deadline - clock(), log, status)
            if limit is not None:
                log.line(f"{step.name}: started (alone, limit {limit:.0f} s): {' '.join(step.command[1:])}")
                running.append(Running(step, limit, logs, env, clock))
                wait()
    except BaseException:  # stopped from outside (SIGTERM, Ctrl-C): nothing left running, what ran recorded
        for r in running:
            r.kill()
            log.step_done({**r.row(memory), "status": "interrupted", "reason": "the suite was stopped"})
        raise
    return status


def _limit(step: Step, left: float, log: Log, status: dict[str, str]) -> float | None:
    """The step's time limit, or None (recorded as skipped) when less than half its estimate is left."""
    if left < step.estimate / 2:
        status[step.name] = "skipped"
        log.step_done({"name": step.name, "status": "skipped",
                       "reason": f"{max(left, 0):.0f} s of the budget left, estimate {step.estimate:.0f} s"})
        return None
    return min(step.cap, left)


# -------------------------------------------------------------------------------- the device


DEVICE_PROBE = """
import importlib.util, json, sys
out = {"python": sys.version.split()[0], "missing": [m for m in %r if importlib.util.find_spec(m) is None],
       "missing_optional": [m for m in %r if importlib.util.find_spec(m) is None]}
try:
    import torch
    out["torch"] = torch.__version__
    out["cuda"] = torch.cuda.is_available()
    if out["cuda"]:
        props = torch.cuda.get_device_properties(0)
        out.update(name=torch.cuda.get_device_name(0), capability=list(torch.cuda.get_device_capability(0)),
                   memory_bytes=props.total_memory, multiprocessors=props.multi_processor_count,
                   cuda_runtime=torch.version.cuda)
except ImportError:
    pass
print(json.dumps(out))
"""


def check_device(device: str, log: Log, env: dict) -> str | None:
    """Print and record the device; the reason to stop, or None."""
    lines = []
    try:
        smi = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=60)
        lines.append(smi.stdout or smi.stderr)
    except (OSError, subprocess.SubprocessError) as exc:
        lines.append(f"nvidia-smi: {exc}\n")
    try:
        probe = subprocess.run([sys.executable, "-c", DEVICE_PROBE % (REQUIRED, OPTIONAL)], capture_output=True,
                               text=True, timeout=120, env=env, cwd=ROOT)
        info = json.loads(probe.stdout) if probe.returncode == 0 else {"error": probe.stderr[-500:]}
    except (OSError, subprocess.SubprocessError, json.JSONDecodeError) as exc:
        info = {"error": f"{type(exc).__name__}: {exc}"}
    log.state["device"] = info
    lines.append(json.dumps(info, indent=2) + "\n")
    (log.work / "device.txt").write_text("".join(lines))
    print("".join(lines), flush=True)
    stop = stop_reason(info, device)
    if stop is not None:
        return stop
    for name in info["missing_optional"]:
        log.line(f"warning: {name} is missing: the step benchmark records its modes as infeasible "
                 "(--prepare copies it)")
    log.line("device: " + (f"{info['name']} ({info['memory_bytes'] / 2**30:.0f} GiB), torch {info['torch']}, CUDA "
                           f"{info['cuda_runtime']}" if info.get("cuda") else f"CPU, torch {info.get('torch')}"))
    return None


def stop_reason(info: dict, device: str) -> str | None:
    """Why the suite cannot run, from the device probe's ``info``; None when it can."""
    if "error" in info:
        return f"the device probe failed: {info['error']}"
    if info["missing"]:
        return (f"missing Python packages {', '.join(info['missing'])}: run `python benchmarks/gpu_suite.py "
                "--prepare` where they are installed and carry .gpu-suite")
    if device.startswith("cuda") and not info.get("cuda"):
        return (f"no CUDA device here (torch {info.get('torch')}: torch.cuda.is_available() is False); run it on a "
                "GPU machine, or with --device cpu --smoke to try the steps on a CPU")
    return None


def environment() -> dict:
    """The steps' environment: the repository and the prepared packages on the path, the commit recorded."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    paths = [str(ROOT), *([str(PREPARED_DIR / "site")] if (PREPARED_DIR / "site").is_dir() else [])]
    env["PYTHONPATH"] = os.pathsep.join([*paths, *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])])
    provenance = PREPARED_DIR / "provenance.json"
    if provenance.is_file():
        env["BENCHMARK_PROVENANCE"] = provenance.read_text()  # harness.PROVENANCE
    return env


def prepare(target: Path = PREPARED_DIR) -> list[str]:
    """Copy ``PREPARED`` (their files as installed, without bytecode) and the commit into ``target``."""
    from importlib.metadata import PackageNotFoundError, distribution

    shutil.rmtree(target, ignore_errors=True)
    site = target / "site"
    copied = []
    for name in PREPARED:
        try:
            dist = distribution(name)
        except PackageNotFoundError:
            raise SystemExit(f"gpu_suite --prepare: {name} is not installed here (python -m pip install -e "
                             "\".[bench]\")") from None
        for file in dist.files or []:
            if "__pycache__" in file.parts or file.suffix == ".pyc" or ".." in file.parts:
                continue
            dest = site / file
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(file.locate(), dest)
        copied.append(f"{name} {dist.version}")

    def git(*args):
        out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
        return out.stdout.strip() if out.returncode == 0 else None

    status = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":!benchmarks/results")
    (target / "provenance.json").write_text(json.dumps({"commit": git("rev-parse", "HEAD"),
                                                        "dirty": None if status is None else bool(status)}))
    return copied


# ------------------------------------------------------------------------------------- main


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, nargs="?", help="output folder (on the device machine: $OUT)")
    ap.add_argument("--device", default="cuda", help="cuda (default), cuda:N, or cpu with --smoke")
    ap.add_argument("--smoke", action="store_true", help="every step at its smallest size")
    ap.add_argument("--budget", type=float, default=BUDGET, help=f"wall seconds for all steps (default {BUDGET:.0f})")
    ap.add_argument("--only", default=None, help="comma-separated steps to run (the others are left out)")
    ap.add_argument("--skip", default="", help="comma-separated steps to leave out")
    ap.add_argument("--work", type=Path, default=None, help="scratch folder (default: a new temporary one)")
    ap.add_argument("--dry-run", action="store_true", help="print the steps and their commands, run nothing")
    ap.add_argument("--prepare", action="store_true", help=f"copy {', '.join(PREPARED)} and the commit into "
                                                           f"{PREPARED_DIR.name}/ for the device machine, and stop")
    args = ap.parse_args(argv)
    if args.prepare:
        return args
    if args.out is None:
        ap.error("the output folder is required (on the device machine: \"$OUT\")")
    if args.device != "cpu" and args.device.split(":")[0] != "cuda":
        ap.error(f"--device must be cuda, cuda:N or cpu, got {args.device!r}")
    if args.device == "cpu" and not args.smoke and not args.dry_run:
        ap.error("--device cpu needs --smoke: the measured sizes are for a GPU")
    if not 0 < args.budget < float("inf"):
        ap.error(f"--budget must be a positive number of seconds, got {args.budget!r}")
    names = [s.name for s in steps(args.device, args.smoke, Path("."))]
    chosen = [n for n in (args.only.split(",") if args.only else names) if n]
    for given in [*chosen, *(n for n in args.skip.split(",") if n)]:
        if given not in names:
            ap.error(f"unknown step {given!r}: the steps are {', '.join(names)}")
    args.chosen = [n for n in chosen if n not in args.skip.split(",")]
    return args


def _stopped(signum, frame):
    raise SystemExit(128 + signum)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.prepare:
        copied = prepare()
        print(f"{PREPARED_DIR}: {', '.join(copied)}; carry {PREPARED_DIR.name} to the device machine")
        return 0
    if args.dry_run:  # nothing made, not even the scratch folder
        work = args.work or Path(tempfile.gettempdir()) / "gpu-suite-WORK"
    else:
        work = args.work or Path(tempfile.mkdtemp(prefix="gpu-suite-"))
    todo = [s for s in steps(args.device, args.smoke, work) if s.name in args.chosen]
    if args.dry_run:
        for s in todo:
            kind = "timed" if s.timed else "concurrent"
            print(f"{s.name} ({kind}, estimate {s.estimate:.0f} s, cap {s.cap:.0f} s"
                  + (f", needs {s.needs}" if s.needs else "") + "):\n    " + " ".join(s.command))
        print(f"estimate {estimate(todo):.0f} s after the device check, budget {args.budget:.0f} s")
        return 0
    work.mkdir(parents=True, exist_ok=True)
    log = Log(args.out, work)
    log.state.update(argv=list(argv), work=str(work), budget_seconds=args.budget, chosen=args.chosen)
    env = environment()
    stop = check_device(args.device, log, env)
    if stop is not None:
        log.line(f"gpu_suite: {stop}")
        log.state["stopped"] = stop
        log.save()
        return 2
    memory = GpuMemory(args.device.startswith("cuda"))
    signal.signal(signal.SIGTERM, _stopped)
    try:
        status = run_steps(todo, log=log, budget=args.budget, env=env, memory=memory)
    finally:
        memory.stop()
    log.line("summary: " + ", ".join(f"{k} {v}" for k, v in status.items()))
    log.save()
    return 0 if status and all(v == "ok" for v in status.values()) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
