"""Data preparation at the paper's sizes: generating, and capping on each engine, 1M to 40M rows.

For each size (``--rows``; users = rows / 5) of the ``pctr`` shape (Criteo Display layout,
13 numeric and 26 categorical columns): ``budgetplan data synth`` into a directory of
Parquet shards, then ``budgetplan data cap`` at K = ``--cap`` with ``--engine local`` and
with ``--engine spark`` (``--spark-master``, up to ``--spark-max-rows``; above it, or past
``--spark-timeout``, the reason is recorded instead). Every step is a child process (the
CLI, as a user runs it) and records:

- wall seconds;
- peak memory: the largest single process's max RSS (``wait4``'s rusage of the child, which
  covers the processes it waited for) and the peak of the sum of RSS over the child's whole
  process tree, sampled every ``SAMPLE_SECONDS`` (the Spark driver and its JVM together);
  for Spark, the JVM's and the Python driver's own sampled peaks too;
- bytes on disk of what it wrote.

The rows kept (N), rows in, units and units over K must agree between the engines at every
size both ran: the benchmark asserts it and records it. The load average (1, 5, 15 min) is
recorded before and after each step: the machine may be shared. Not a test:
``python benchmarks/data_scale.py`` (about 40 minutes on 2 cores); writes
``results/data_scale.json`` and ``.md``. ``--smoke --out DIR``: synth and the local cap of 1,000 rows in
two shards; Spark skipped (its JVM alone takes longer to start than a smoke run may).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import harness as h

SHAPE = "pctr"
USERS_PER_ROW = 5
SAMPLE_SECONDS = 0.25
_PAGE = os.sysconf("SC_PAGE_SIZE")
# --smoke: every step but Spark's, on two shards of a tiny table
SMOKE = {"rows": [1_000], "shard_rows": 500, "cap": 2}
SMOKE_NO_SPARK = ("not in a smoke run: Spark's local JVM takes about 40 s to start "
                  "(tests/trainers/test_prepare_spark.py, a slow test, checks the Spark cap against the local one)")


def _int_list(text: str) -> list[int]:
    return [int(float(x)) for x in text.split(",") if x.strip()]


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=_int_list, default=[1_000_000, 4_000_000, 16_000_000, 40_000_000],
                    help="comma-separated sizes")
    ap.add_argument("--cap", type=int, default=5, help="K of data cap")
    ap.add_argument("--shard-rows", type=int, default=2_000_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--spark-master", default="local[2]")
    ap.add_argument("--spark-driver-memory", default="4g", help="the Spark driver's JVM heap (local mode: all of it)")
    ap.add_argument("--spark-max-rows", type=int, default=40_000_000, help="skip Spark above this many rows")
    ap.add_argument("--spark-timeout", type=float, default=1200.0, help="seconds before a Spark cap is killed")
    ap.add_argument("--work", type=Path, default=None, help="scratch directory (default: a new temporary one)")
    ap.add_argument("--out", type=Path, default=h.RESULTS)
    h.add_smoke(ap)
    args = ap.parse_args(argv)
    args.argv = list(argv)
    h.apply_smoke(ap, args, argv, SMOKE)
    if not args.rows or min(args.rows) < USERS_PER_ROW:
        ap.error(f"--rows must be sizes of at least {USERS_PER_ROW}, got {args.rows}")
    for what, value in (("--cap", args.cap), ("--shard-rows", args.shard_rows), ("--spark-max-rows",
                                                                                 args.spark_max_rows)):
        if value < 1:
            ap.error(f"{what} must be at least 1, got {value}")
    if not 0 < args.spark_timeout < float("inf"):
        ap.error(f"--spark-timeout must be a finite number of seconds > 0, got {args.spark_timeout!r}")
    return args


def settings(args: argparse.Namespace) -> dict:
    from trainers.data.synth import get_shape

    return h.settings_record("data_scale.py", args.argv, {
        "rows": args.rows, "users": [r // USERS_PER_ROW for r in args.rows], "shape": get_shape(SHAPE).parameters(),
        "cap": args.cap, "shard_rows": args.shard_rows, "seed": args.seed, "spark_master": args.spark_master,
        "spark_driver_memory": args.spark_driver_memory, "spark_max_rows": args.spark_max_rows,
        "spark_timeout_seconds": args.spark_timeout, "sample_seconds": SAMPLE_SECONDS})


def _tree(root: int) -> dict[int, tuple[str, int]]:
    """{pid: (command name, RSS bytes)} of ``root`` and its descendants, from /proc."""
    procs: dict[int, tuple[int, str, int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
            rss = int(Path(entry.path, "statm").read_text().split()[1]) * _PAGE
        except OSError:
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        procs[int(entry.name)] = (int(stat[stat.rindex(")") + 2:].split()[1]), name, rss)
    keep, frontier = {}, [root]
    while frontier:
        pid = frontier.pop()
        if pid in procs:
            keep[pid] = procs[pid][1:]
            frontier += [p for p, v in procs.items() if v[0] == pid]
    return keep


def _measure(cmd: list[str], *, timeout: float | None = None, env: dict | None = None) -> dict:
    """Run ``cmd``; its wall time, exit status, stdout, and peak memory (module docstring)."""
    full_env = dict(os.environ) | (env or {})
    full_env["PYTHONPATH"] = os.pathsep.join(p for p in (str(h.ROOT), full_env.get("PYTHONPATH", "")) if p)
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=full_env, cwd=h.ROOT,
                            start_new_session=True)
    peaks = {"tree": 0, "java": 0, "python": 0}
    done = threading.Event()

    def sample():
        while not done.wait(SAMPLE_SECONDS):
            tree = _tree(proc.pid)
            peaks["tree"] = max(peaks["tree"], sum(rss for _, rss in tree.values()))
            for kind in ("java", "python"):
                peaks[kind] = max(peaks[kind], sum(rss for name, rss in tree.values() if name.startswith(kind)))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    streams: dict = {}

    def drain(name, stream):
        streams[name] = stream.read()

    readers = [threading.Thread(target=drain, args=(n, st), daemon=True)
               for n, st in (("out", proc.stdout), ("err", proc.stderr))]
    for r in readers:
        r.start()
    timed_out = threading.Event()

    def kill():
        timed_out.set()
        os.killpg(proc.pid, 9)  # the child's own session: the JVM goes with it

    timer = threading.Timer(timeout, kill) if timeout else None
    if timer is not None:
        timer.start()
    # wait4, not Popen.wait: its rusage is the child's own, max RSS included (the largest of it and what it reaped)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if timer is not None:
        timer.cancel()
    done.set()
    for t in (sampler, *readers):
        t.join()
    return {"seconds": time.perf_counter() - t0, "returncode": proc.returncode, "timed_out": timed_out.is_set(),
            "stdout": streams["out"].decode(), "stderr_tail": streams["err"].decode()[-800:],
            "max_rss_bytes": int(usage.ru_maxrss) * 1024, "peak_rss_tree_bytes": peaks["tree"],
            "peak_rss_java_bytes": peaks["java"] or None, "peak_rss_python_bytes": peaks["python"],
            "load_before": list(load_before), "load_after": list(os.getloadavg())}


def _disk(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _cli(*args) -> list[str]:
    return [sys.executable, "-m", "budgetplan", *map(str, args)]


def _step(result: dict, label: str, bar, task) -> dict:
    bar.update(task, description=label)
    out = {k: v for k, v in result.items() if k not in ("stdout",)}
    if result["returncode"] != 0 and not result["timed_out"]:
        raise SystemExit(f"{label} failed ({result['returncode']}): {result['stderr_tail']}")
    return out


def run(args) -> dict:

    work = args.work or Path(tempfile.mkdtemp(prefix="data-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    key = work / "key"
    key.write_bytes(bytes(range(32)))  # a benchmark key: which rows are kept does not matter here
    result: dict = {"settings": settings(args), "sizes": []}
    with h.progress() as bar:
        task = bar.add_task("data scale", total=3 * len(args.rows))
        for rows in args.rows:
            users = rows // USERS_PER_ROW
            data, local_out, spark_out = work / f"synth-{rows}", work / f"cap-local-{rows}", work / f"cap-spark-{rows}"
            for p in (data, local_out, spark_out):
                shutil.rmtree(p, ignore_errors=True)
            size: dict = {"rows": rows, "users": users}
            gen = _measure(_cli("data", "synth", "--rows", rows, "--users", users, "--shape", SHAPE, "--seed",
                                args.seed, "--shard-rows", args.shard_rows, "--out", f"{data}/", "--json"))
            size["synth"] = _step(gen, f"{rows:,}: synth", bar, task)
            summary = json.loads(gen["stdout"])
            size["synth"] |= {"bytes_on_disk": _disk(data), "shards": len(summary["shards"]),
                              "conversion_rate": summary["conversion_rate"]}
            bar.advance(task)
            cap = ["data", "cap", data, "--unit-id", "user_id", "--unit-cap", args.cap, "--key", key, "--json"]
            bar.update(task, description=f"{rows:,}: cap (local)")
            local = _measure(_cli(*cap, "--out", local_out))
            size["cap_local"] = _step(local, f"{rows:,}: cap local", bar, task)
            manifest = json.loads(local["stdout"])
            counts = {k: manifest[k] for k in ("rows", "rows_in", "units", "units_capped")}
            size["cap_local"] |= {"bytes_on_disk": _disk(local_out), **counts}
            shutil.rmtree(local_out, ignore_errors=True)
            bar.advance(task)
            if args.smoke or rows > args.spark_max_rows:
                size["cap_spark"] = {"skipped": SMOKE_NO_SPARK if args.smoke else
                                     f"{rows:,} rows is above --spark-max-rows {args.spark_max_rows:,}"}
            else:
                bar.update(task, description=f"{rows:,}: cap (spark {args.spark_master})")
                memory = {"PYSPARK_SUBMIT_ARGS": f"--driver-memory {args.spark_driver_memory} pyspark-shell"}
                spark = _measure(_cli(*cap, "--out", spark_out, "--engine", "spark", "--spark-master",
                                      args.spark_master), timeout=args.spark_timeout, env=memory)
                size["cap_spark"] = _step(spark, f"{rows:,}: cap spark", bar, task)
                if spark["timed_out"]:
                    size["cap_spark"]["skipped"] = f"killed after --spark-timeout {args.spark_timeout:.0f} s"
                else:
                    theirs = json.loads(spark["stdout"])
                    other = {k: theirs[k] for k in counts}
                    assert other == counts, f"{rows}: the engines disagree: local {counts}, spark {other}"
                    size["cap_spark"] |= {"bytes_on_disk": _disk(spark_out), **other, "agrees_with_local": True}
            shutil.rmtree(spark_out, ignore_errors=True)
            shutil.rmtree(data, ignore_errors=True)
            bar.advance(task)
            result["sizes"].append(size)
            h.save_results(args.out, "data_scale", result, render)  # a long run keeps what it has measured
    result["machine"] = h.machine()
    return result


def _mib(n) -> str:
    return "-" if n is None else f"{n / 2**20:,.0f}"


def render(result: dict) -> str:
    s = result["settings"]["values"]
    lines = ["# Data preparation at scale: synth, and cap on each engine", "",
             f"Shape `{SHAPE}` (Criteo Display layout: 13 numeric, 26 categorical columns), users = rows / "
             f"{USERS_PER_ROW}, K = {s['cap']}, shards of at most {s['shard_rows']:,} rows; Spark "
             f"`{s['spark_master']}` with driver memory {s['spark_driver_memory']}. Seconds of wall time. Peak RSS in "
             "MiB: synth and the local cap are one process (its max RSS, from wait4); Spark's is the sum over the "
             "driver and its JVM "
             f"(sampled every {s['sample_seconds']} s), the JVM's alone in brackets. N = rows kept by the cap.", "",
             "| rows | users | synth s | synth peak MiB | data MB | cap local s | local peak MiB | spark s | "
             "spark peak MiB (JVM) | N | N agrees | load 1m (start) |", "|" + "---|" * 12]
    for z in result["sizes"]:
        g, loc, sp = z["synth"], z["cap_local"], z["cap_spark"]
        if "skipped" in sp:
            spark_cells = ["skipped", "-", "-"]
        else:
            spark_cells = [f"{sp['seconds']:.0f}", f"{_mib(sp['peak_rss_tree_bytes'])} "
                           f"({_mib(sp['peak_rss_java_bytes'])})", "yes" if sp.get("agrees_with_local") else "no"]
        lines.append(f"| {z['rows']:,} | {z['users']:,} | {g['seconds']:.0f} | {_mib(g['max_rss_bytes'])} | "
                     f"{g['bytes_on_disk'] / 1e6:,.0f} | {loc['seconds']:.0f} | {_mib(loc['max_rss_bytes'])} | "
                     f"{spark_cells[0]} | {spark_cells[1]} | {loc['rows']:,} | {spark_cells[2]} | "
                     f"{g['load_before'][0]:.2f} |")
    skipped = [f"{z['rows']:,}: {z['cap_spark']['skipped']}" for z in result["sizes"] if "skipped" in z["cap_spark"]]
    if skipped:
        lines += ["", "Spark not measured: " + "; ".join(skipped) + "."]
    lines += ["", "Load average (1, 5, 15 min) before each step: " + "; ".join(
        f"{z['rows']:,} {step} " + "/".join(f"{x:.2f}" for x in z[step]["load_before"])
        for z in result["sizes"] for step in ("synth", "cap_local", "cap_spark") if "load_before" in z[step]) + ".",
        "", f"Machine: {result.get('machine', {}).get('cpus', '?')} CPUs, "
        f"{(result.get('machine', {}).get('memory_bytes') or 0) / 2**30:.0f} GiB.", "",
        h.settings_markdown(result["settings"]), ""]
    return "\n".join(lines)


def main(argv: list[str]) -> dict:
    args = parse_args(argv)
    result = run(args)
    print(h.save_results(args.out, "data_scale", result, render))
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
