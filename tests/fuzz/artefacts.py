"""Valid inputs the corpus starts from (and edits): plans, scenarios, small data, run directories.

Each is built once per test session, by the Python API (not by the CLI under test), in a
cache directory, and copied into a case's directory on demand. The data is tiny (a few
hundred synthetic rows) so that the few cases that do train finish in a fraction of a
second.
"""

from __future__ import annotations

import shutil
from pathlib import Path

__all__ = ["Artefacts", "TRAIN_ROWS", "EVAL_ROWS", "SMALL_SCENARIOS", "train_scenario", "train_dpsgd_scenario",
           "train_hybrid_scenario"]

TRAIN_ROWS, EVAL_ROWS, USERS = 300, 120, 60

# Small, fast-to-plan scenarios per algorithm: the base every scenario-key case edits.
SMALL_SCENARIOS = {
    "rr": """name = "fuzz-rr"

[budget]
epsilon = 2.0
delta = 0.0

[privacy]
adjacency = "replace-one"
unit = "impression"

[data]
dataset_size = 10000

[algorithm]
name = "rr"

[rr]
epochs = 2
batch_size = 100
""",
    "dpsgd": """name = "fuzz-dpsgd"

[budget]
epsilon = 4.0
delta = 1e-6

[privacy]
adjacency = "add-remove"
unit = "impression"

[data]
dataset_size = 10000

[algorithm]
name = "dpsgd"

[dpsgd]
batch_size = 100
steps = 20
clipping_norm = 1.0
noise_multiplier = 2.0

[accounting]
method = "rdp"
""",
    "walr": """name = "fuzz-walr"

[budget]
epsilon = 1.0
delta = 1e-6

[privacy]
adjacency = "replace-one"
unit = "impression"

[data]
dataset_size = 10000

[algorithm]
name = "walr"

[walr]
features = 5
row_norm_bound = 2.0
weights_bound = 1.0
""",
    "hybrid": """name = "fuzz-hybrid"

[budget]
epsilon = 8.0
delta = 1e-6

[privacy]
adjacency = "replace-one"
unit = "impression"

[data]
dataset_size = 10000

[algorithm]
name = "hybrid"
split = "alpha=0.5"

[rr]
epochs = 1
batch_size = 100

[dpsgd]
batch_size = 100
steps = 10
clipping_norm = 1.0
noise_multiplier = 3.0

[accounting]
discretization = 1e-3
""",
}


def train_dpsgd_scenario(rows: int = TRAIN_ROWS) -> str:
    """A DP-SGD scenario over the synthetic columns: a few noisy steps, accounted by RDP (fast to verify)."""
    from trainers.data.synth import SYNTH_FEATURES

    return f"""name = "fuzz-train-dpsgd"

[budget]
epsilon = 8.0
delta = 1e-5

[privacy]
adjacency = "add-remove"
unit = "impression"

[data]
dataset_size = {rows}

[algorithm]
name = "dpsgd"

[dpsgd]
batch_size = 30
steps = 3
clipping_norm = 1.0
noise_multiplier = 1.0

[accounting]
method = "rdp"

{SYNTH_FEATURES.to_toml()}"""


def train_hybrid_scenario(rows: int = TRAIN_ROWS) -> str:
    """A Hybrid scenario over the synthetic columns (RR, then 24 Poisson DP-SGD steps): the run the forged
    records (``tests/forgeries.py``) are made from. At epsilon 1 the RR phase flips about a third of the
    labels, so that a count of flips halved is far outside what 300 labels allow."""
    from trainers.data.synth import SYNTH_FEATURES

    return f"""name = "fuzz-train-hybrid"

[budget]
epsilon = 1.0
delta = 1e-5

[privacy]
adjacency = "replace-one"
unit = "impression"

[data]
dataset_size = {rows}

[algorithm]
name = "hybrid"
split = "alpha=0.5"

[rr]
epochs = 1
batch_size = 64

[dpsgd]
batch_size = 30
steps = 24
clipping_norm = 1.0

[accounting]
discretization = 1e-3

{SYNTH_FEATURES.to_toml()}"""


def train_scenario(rows: int = TRAIN_ROWS, *, extra: str = "") -> str:
    """An RR scenario over the synthetic columns, N = ``rows``: what the train cases execute."""
    from trainers.data.synth import SYNTH_FEATURES

    return f"""name = "fuzz-train"

[budget]
epsilon = 2.0
delta = 0.0

[privacy]
adjacency = "replace-one"
unit = "impression"

[data]
dataset_size = {rows}

[algorithm]
name = "rr"

[rr]
epochs = 1
batch_size = 64
{extra}
{SYNTH_FEATURES.to_toml()}"""


class Artefacts:
    """Builds each named artefact on first use under ``root`` and copies it into cases."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self._built: dict[str, Path] = {}

    def path(self, name: str) -> Path:
        if name not in self._built:
            builder = _BUILDERS.get(name)
            if builder is None:
                raise KeyError(f"no artefact named {name!r}")
            self._built[name] = builder(self)
        return self._built[name]

    def read(self, name: str) -> bytes:
        return self.path(name).read_bytes()

    def copy(self, name: str, target: Path, edit=None) -> None:
        source = self.path(name)
        if source.is_dir():
            shutil.copytree(source, target)
            if callable(edit):  # edits the copied directory in place (a forged run: several files at once)
                edit(target)
            elif edit is not None:
                rel, fn = edit
                f = target / rel
                new = fn(f.read_bytes())
                if new is None:
                    f.unlink()
                else:
                    f.write_bytes(new)
            return
        data = source.read_bytes()
        target.write_bytes(edit(data) if edit is not None else data)


def _plan_of(text: str):
    from budgetplan.planning.planner import build_plan
    from budgetplan.scenario.model import parse_scenario

    return build_plan(parse_scenario(text))


def _write(a: Artefacts, name: str, data: bytes | str) -> Path:
    path = a.root / name
    path.write_bytes(data.encode("ascii") if isinstance(data, str) else data)
    return path


def _example_plan(example: str):
    def build(a: Artefacts) -> Path:
        from budgetplan.scenario import examples as ex

        return _write(a, f"plan-{example}.json", _plan_of(ex.text(example)).to_json())
    return build


def _small_plan(algorithm: str):
    def build(a: Artefacts) -> Path:
        return _write(a, f"plan-small-{algorithm}.json", _plan_of(SMALL_SCENARIOS[algorithm]).to_json())
    return build


def _non_ascii_plan(a: Artefacts) -> Path:
    text = SMALL_SCENARIOS["rr"].replace('name = "fuzz-rr"',
                                         'name = "Anzeigen-Prüfung ✓"\ndescription = "für alle"')
    return _write(a, "plan-non-ascii.json", _plan_of(text).to_json())


def _train_plan(a: Artefacts) -> Path:
    return _write(a, "plan-train.json", _plan_of(train_scenario()).to_json())


def _train_user_plan(a: Artefacts) -> Path:
    """RR on units capped at K = 2 impressions: N is the synthetic data's row count after capping."""
    import pyarrow.parquet as pq

    from trainers.data.capping import capped_rows

    ids = pq.read_table(a.path("train-parquet"), columns=["user_id"]).column("user_id").to_numpy()
    n = capped_rows(ids, [2])["caps"][0]["rows"]
    text = train_scenario(n).replace('unit = "impression"', 'unit = "user x time"\ncap = 2')
    return _write(a, "plan-train-user.json", _plan_of(text).to_json())


def _train_dpsgd_plan(a: Artefacts) -> Path:
    return _write(a, "plan-train-dpsgd.json", _plan_of(train_dpsgd_scenario()).to_json())


def _table(rows: int, users: int, seed: int):
    from trainers.data.synth import synthesize

    return synthesize(rows, users, seed)


def _train_parquet(a: Artefacts) -> Path:
    import pyarrow.parquet as pq

    path = a.root / "train.parquet"
    pq.write_table(_table(TRAIN_ROWS, USERS, 1), path)
    return path


def _eval_parquet(a: Artefacts) -> Path:
    import pyarrow.parquet as pq

    path = a.root / "eval.parquet"
    pq.write_table(_table(EVAL_ROWS, 30, 2), path)
    return path


def _train_csv(a: Artefacts) -> Path:
    import pyarrow as pa
    import pyarrow.csv as pacsv

    table = _table(TRAIN_ROWS, USERS, 1)
    plain = pa.table([c.cast(c.type.value_type) if pa.types.is_dictionary(c.type) else c for c in table.columns],
                     names=table.column_names)
    path = a.root / "train.csv"
    pacsv.write_csv(plain, path)
    return path


_FAST = dict(embedding_dim=2, tower_hidden=8, common_hidden=(8,), batch_size=64)


def _run_rr(a: Artefacts) -> Path:
    from budgetplan.plan import load_plan
    from trainers.run import RunOptions, TrainSettings, execute_plan

    out = a.root / "run-rr"
    execute_plan(load_plan(a.path("plan-train")), a.path("train-parquet"),
                 RunOptions(eval_path=a.path("eval-parquet"), out_dir=out, settings=TrainSettings(**_FAST), seed=7))
    return out


def _run_hybrid(a: Artefacts) -> Path:
    """A completed Hybrid run drawing from the CSPRNG (its record says so, and forgeries may say otherwise)."""
    from trainers.run import RunOptions, TrainSettings, execute_plan

    out = a.root / "run-hybrid"
    execute_plan(_plan_of(train_hybrid_scenario()), a.path("train-parquet"),
                 RunOptions(out_dir=out, settings=TrainSettings(**_FAST)))
    return out


def _run_baseline(a: Artefacts) -> Path:
    from budgetplan.plan import load_plan
    from trainers.baseline import BaselineSettings
    from trainers.run import TrainSettings, run_baseline

    out = a.root / "run-baseline"
    run_baseline(load_plan(a.path("plan-train")), a.path("train-parquet"), eval_path=a.path("eval-parquet"),
                 out_dir=out, settings=TrainSettings(**_FAST), baseline=BaselineSettings(max_epochs=1), seed=7)
    return out


def _small_scenario(algorithm: str):
    def build(a: Artefacts) -> Path:
        return _write(a, f"scenario-small-{algorithm}.toml", SMALL_SCENARIOS[algorithm])
    return build


_BUILDERS = {
    "scenario-small-rr": _small_scenario("rr"),
    "plan-rr-impression": _example_plan("rr-impression"),
    "plan-walr": _example_plan("walr"),
    "plan-small-dpsgd": _small_plan("dpsgd"),
    "plan-small-hybrid": _small_plan("hybrid"),
    "plan-train": _train_plan,
    "plan-non-ascii": _non_ascii_plan,
    "plan-train-dpsgd": _train_dpsgd_plan,
    "plan-train-user": _train_user_plan,
    "train-parquet": _train_parquet,
    "eval-parquet": _eval_parquet,
    "train-csv": _train_csv,
    "run-rr": _run_rr,
    "run-hybrid": _run_hybrid,
    "run-baseline": _run_baseline,
}
