"""Write the three notebooks in this folder from the cell sources below, without outputs.

The notebooks are the artefact people open; this script is only how they are kept tidy:
cell ids are fixed (so a regenerated notebook diffs cleanly) and no outputs are stored.
Edit a cell here, then run ``python notebooks/build_notebooks.py`` (tests/test_notebooks.py
checks that the stored notebooks match this script and that each runs top to bottom).
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat

HERE = Path(__file__).resolve().parent

# --------------------------------------------------------------------------------------------
# Shared set-up: every notebook defines it in plain sight rather than importing a helper.

SETUP_HELPERS = r'''
def run_cli(*args):
    """`budgetplan ARGS` in a subprocess with this kernel's Python; returns the CompletedProcess."""
    return subprocess.run([sys.executable, "-m", "budgetplan", *map(str, args)], capture_output=True, text=True,
                          env=CLI_ENV, cwd=WORK, check=False)  # cli() checks the exit code


def cli(*args, ok=(0,), head=None):
    """Run `budgetplan ARGS`, print the command, its exit code and (the first `head` lines of) its output."""
    proc = run_cli(*args)
    print(f"$ budgetplan {' '.join(map(str, args))}    [exit {proc.returncode}]")
    lines = proc.stdout.rstrip().splitlines()
    if head is not None and len(lines) > head:
        lines = lines[:head] + [f"... ({len(lines) - head} more lines)"]
    print("\n".join(lines))
    if proc.stderr.strip():
        print("[stderr]", proc.stderr.rstrip())
    if proc.returncode not in ok:
        raise RuntimeError(f"budgetplan {args[0]} exited {proc.returncode}, expected one of {ok}")


def show_table(rows, columns):
    """Print a list of dicts as a plain fixed-width table (numbers to 6 significant digits)."""
    def fmt(v):
        return "-" if v is None else f"{v:.6g}" if isinstance(v, float) else str(v)
    cells = [list(columns)] + [[fmt(r.get(c)) for c in columns] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    for j, row in enumerate(cells):
        print("  ".join(v.rjust(w) for v, w in zip(row, widths)))
        if j == 0:
            print("  ".join("-" * w for w in widths))
'''


def setup_cell(prefix: str, stdlib: str = "", third_party: str = "") -> str:
    return ("import json\nimport logging\nimport os\n" + stdlib + "import subprocess\nimport sys\nimport tempfile\n"
            "from pathlib import Path\n\n" + third_party + "from IPython.display import Image, display\n\n"
            "import budgetplan as bp\n" + r'''
# dp_accounting logs a warning for every Renyi order it drops: noise here.
logging.getLogger("absl").setLevel(logging.ERROR)

# Everything this notebook writes goes into a fresh temporary directory, never the repository.
WORK = Path(tempfile.mkdtemp(prefix="''' + prefix + r'''"))
# The CLI runs as `python -m budgetplan` with this kernel's interpreter; PYTHONPATH names the
# checkout this kernel imported budgetplan from, so the subprocess sees the same package
# (harmless when budgetplan is installed). COLUMNS widens the CLI's tables; ipykernel sets
# FORCE_COLOR and CLICOLOR_FORCE for its own output, which would put colour codes in the CLI's text.
REPO = Path(bp.__file__).resolve().parent.parent
CLI_ENV = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "CLICOLOR_FORCE")}
CLI_ENV.update(COLUMNS="110", PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p))
print("writing to", WORK)

''' + SETUP_HELPERS).strip()


def outputs_cell(pngs_expr: str) -> str:
    return (r'''# The figures this notebook drew; everything it wrote is under WORK.
# tests/test_notebooks.py reads the "outputs:" line below.
pngs = ''' + pngs_expr + r'''
files = [p for p in WORK.rglob("*") if p.is_file()]
print(f"{len(files)} files, {sum(p.stat().st_size for p in files) / 1e6:.1f} MB under {WORK}")
for path in pngs:
    print(f"  {path.relative_to(WORK)}  ({path.stat().st_size:,} bytes)")
print("outputs:", json.dumps({"work_dir": str(WORK), "pngs": [str(p) for p in pngs]}))''')


# --------------------------------------------------------------------------------------------
# 01: plan a budget

NB01 = [
    ("md", r'''# Plan a privacy budget: the CLI and the Python API side by side

`budgetplan` answers "what (epsilon, delta) does this cost?" and "what noise meets this budget?"
for the mechanisms used to train ads models with label DP and semi-sensitive features:

1. **randomized response** (RR) on labels, a one-shot **Gaussian release**, and **DP-SGD** with
   Poisson sampling, accounted by PLD, RDP and PRV; **group privacy**;
2. how epsilon grows with **epochs** for several noise multipliers, under each accountant (a figure);
3. what a **user-level cap** of K examples per user costs under each way of bounding a user (a table
   and a figure);
4. the **Hybrid split table** (RR then DP-SGD) of Chua et al., *Training Differentially Private Ad
   Prediction Models with Semi-Sensitive Features*, at their Criteo pCTR shape.

Every CLI command is run as a subprocess and its output printed; the Python call that computes the
same thing follows it. Nothing here trains a model: it is all accounting, so the paper's dataset
size costs no more than a small one. The notebook writes only to a temporary directory.'''),
    ("code", r'''# Parameters. Accounting costs the same at any N, so the defaults already are the paper's
# Criteo Display Ads pCTR shape (about 40M labelled rows, 80% for training); they run on a
# 2-core CPU in well under a minute. For a finer or wider picture raise CURVE_POINTS, PRV_POINTS
# and SPLIT_EPSILONS (the paper's grid: (1, 3, 5, 10, 20, 30, 50), about 10 s more).
DATASET_SIZE = 32_000_000          # N, training rows
BATCH_SIZE = 16_384                # DP-SGD expected batch size B (sampling rate q = B / N)
EPOCHS = 3                         # DP-SGD epochs (steps = ceil(EPOCHS N / B))
DELTA = 1e-8                       # well below 1/N
NOISE_MULTIPLIER = 1.0             # for the accounting examples
TARGET_EPSILON = 2.0               # for the calibration example

NOISE_MULTIPLIERS = (0.6, 0.8, 1.2)   # one curve each in the epsilon-vs-epochs figure
CURVE_EPOCHS = 6                      # the curves' x range
CURVE_POINTS = 12                     # epochs evaluated per curve (PLD and RDP)
PRV_POINTS = 4                        # PRV is slower: evaluated at this many of them

USER_EPSILON, USER_DELTA = 1.0, 1e-7  # a user-level RR budget (DP-SGD's user-level epsilon is at DELTA)
RR_CAPS = (1, 2, 5, 10, 50)           # K, examples per user after capping (RR)
DPSGD_CAPS = (1, 2, 4, 8)             # K for DP-SGD

SPLIT_EPSILONS = (1, 3, 10)           # total epsilons of the Hybrid split table
SPLIT_ALPHAS = (0, 0.25, 0.5, 0.75, 1)  # RR's share of epsilon: eps1 = alpha eps'''),
    ("code", setup_cell("budgetplan-01-")),
    ("md", r'''## Randomized response (label DP)

RR keeps each binary label with probability e^eps / (1 + e^eps) and flips it otherwise: pure
eps-DP for the label of one example (a replace-one relation, so RR is accounted under
`replace-one` only). The accounting is exact.'''),
    ("code", r'''cli("rr", "--epsilon", 1)
cli("rr", "--flip-probability", 0.1)'''),
    ("code", r'''from budgetplan.accounting.rr import epsilon_from_flip_probability, flip_probability

g = bp.account(bp.RandomizedResponse(epsilon=1.0), delta=0.0, adjacency="replace-one")
print(f"eps = 1: flip probability {flip_probability(1.0):.6f}; guarantee ({g.epsilon:g}, {g.delta:g}) "
      f"by {g.method}, bound {g.bound}")
print(f"flip probability 0.1: epsilon {epsilon_from_flip_probability(0.1):.4f}")'''),
    ("md", r'''## A one-shot Gaussian release

For one noisy release of a sum with L2 sensitivity Delta (WALR's noisy dot product), the analytic
Gaussian mechanism (Balle and Wang 2018) gives the exact noise for (eps, delta); the classical
sqrt(2 ln(1.25/delta)) Delta / eps formula is shown for comparison and is not a guarantee at eps >= 1.'''),
    ("code", r'''cli("gaussian", "--epsilon", 1, "--delta", 1e-5, "--sensitivity", 1)'''),
    ("code", r'''cal = bp.gaussian_noise_std(epsilon=1.0, delta=1e-5, sensitivity=1.0)
print(f"noise std {cal.value:.4f} for ({cal.guarantee.epsilon:g}, {cal.guarantee.delta:g}) by {cal.guarantee.method}")
g = bp.account(bp.GaussianRelease(noise_std=3.73, sensitivity=1.0), delta=1e-5, adjacency="replace-one")
print(f"noise std 3.73: epsilon {g.epsilon:.4f}")'''),
    ("md", r'''## DP-SGD: accounting and calibration

DP-SGD with Poisson sampling (every example joins each batch independently with probability q)
takes T = ceil(epochs N / B) noisy steps. Given the noise multiplier sigma, `account` says what it
costs; `dpsgd_noise_multiplier` finds the smallest sigma for a target. PLD (privacy loss
distributions) is the tight default, RDP is looser, PRV is an estimate with an error band used as a
cross-check. Under `replace-one` (semi-sensitive DP, Hybrid's relation) one example moves the
clipped sum by 2C rather than C, so the same sigma costs more.'''),
    ("code", r'''Q = BATCH_SIZE / DATASET_SIZE
STEPS = bp.steps_for_epochs(epochs=EPOCHS, dataset_size=DATASET_SIZE, batch_size=BATCH_SIZE)
print(f"q = {Q:.6g}, T = {STEPS} steps")
SHAPE = ("--dataset-size", DATASET_SIZE, "--batch-size", BATCH_SIZE, "--delta", DELTA)
cli("dpsgd", "--noise-multiplier", NOISE_MULTIPLIER, "--epochs", EPOCHS, *SHAPE, "--accountant", "all")'''),
    ("code", r'''mech = bp.PoissonDPSGD(noise_multiplier=NOISE_MULTIPLIER, sampling_rate=Q, steps=STEPS)
rows = []
for method in ("pld", "rdp", "prv"):
    g = bp.account(mech, delta=DELTA, adjacency="add-remove", method=method)
    rows.append({"adjacency": "add-remove", "accountant": method, "epsilon": g.epsilon, "bound": g.bound,
                 "band": None if g.epsilon_range is None else f"[{g.epsilon_range[0]:.4g}, {g.epsilon_range[1]:.4g}]"})
g = bp.account(mech, delta=DELTA, adjacency="replace-one")   # PLD: the only accountant for replace-one here
rows.append({"adjacency": "replace-one", "accountant": g.method, "epsilon": g.epsilon, "bound": g.bound})
show_table(rows, ["adjacency", "accountant", "epsilon", "bound", "band"])'''),
    ("code", r'''cli("dpsgd", "--epsilon", TARGET_EPSILON, "--epochs", EPOCHS, *SHAPE)
cal = bp.dpsgd_noise_multiplier(epsilon=TARGET_EPSILON, delta=DELTA, sampling_rate=Q, steps=STEPS)
print(f"\nPython: sigma = {cal.value:.6f} gives epsilon {cal.guarantee.epsilon:.6f} "
      f"(re-checked at half the PLD grid: {cal.verified_epsilon:.6f}; {cal.evaluations} accountings)")'''),
    ("code", r'''# Both sigma and epsilon given, no epochs: how long can training run?
cli("dpsgd", "--epsilon", TARGET_EPSILON, "--noise-multiplier", 0.8, *SHAPE)
most = bp.dpsgd_max_steps(noise_multiplier=0.8, sampling_rate=Q, epsilon=TARGET_EPSILON, delta=DELTA)
print(f"\nPython: at most {int(most.value):,} steps = {most.value * BATCH_SIZE / DATASET_SIZE:.2f} epochs "
      f"(epsilon {most.guarantee.epsilon:.5f})")'''),
    ("md", r'''## Group privacy

The generic bound for a group of K examples from an (eps, delta) guarantee for one:
(K eps, delta (e^{K eps} - 1) / (e^eps - 1)). Loose, but it applies to any mechanism.'''),
    ("code", r'''from budgetplan.accounting.group import group_privacy

cli("group", "--epsilon", 1, "--delta", 1e-7, "--group-size", 5)
eps_k, delta_k = group_privacy(epsilon=1.0, delta=1e-7, group_size=5)
print(f"\nPython: a group of 5 is ({eps_k:g}, {delta_k:.5g})-DP")'''),
    ("md", r'''## Epsilon against epochs, per accountant

`epsilon_curve` accounts DP-SGD after each number of epochs, for each noise multiplier and each
accountant; `plot_epsilon_curve` draws it (one colour per sigma; PLD solid, RDP dashed, PRV dotted
with its error band). RDP's gap to PLD is what a looser accountant costs: the same training
reported at a larger epsilon, or more noise for the same target.'''),
    ("code", r'''from budgetplan.report.plots import epsilon_curve, plot_epsilon_curve

epochs = [CURVE_EPOCHS * (i + 1) / CURVE_POINTS for i in range(CURVE_POINTS)]
curve = epsilon_curve(noise_multipliers=NOISE_MULTIPLIERS, sampling_rate=Q,
                      steps_per_epoch=round(DATASET_SIZE / BATCH_SIZE), epochs=epochs, delta=DELTA,
                      accountants=("pld", "rdp", "prv"), prv_points=PRV_POINTS)
curve_png = plot_epsilon_curve(curve, WORK / "epsilon_curve.png",
                               title=f"DP-SGD, N={DATASET_SIZE:,}, B={BATCH_SIZE:,}, delta={DELTA:g} (add-remove)")
display(Image(filename=str(curve_png)))
at = max(e for e in epochs if e <= EPOCHS)
show_table([r for r in curve if r["epochs"] == at],
           ["noise_multiplier", "accountant", "epochs", "steps", "epsilon", "epsilon_low", "epsilon_high"])'''),
    ("code", r'''# The same figure from the CLI (PLD and RDP only here, to keep it quick).
cli("plot", "curve", *[a for s in NOISE_MULTIPLIERS for a in ("--noise-multiplier", s)],
    "--dataset-size", DATASET_SIZE, "--batch-size", BATCH_SIZE, "--max-epochs", CURVE_EPOCHS,
    "--points", 6, "--delta", DELTA, "--accountant", "pld", "--accountant", "rdp",
    "-o", WORK / "epsilon_curve_cli.png")
display(Image(filename=str(WORK / "epsilon_curve_cli.png")))'''),
    ("md", r'''## What a user-level cap costs

A user contributes up to K examples after capping. The guarantee for the user can be bounded in
several ways, and they differ in cost:

* **RR.** Each of a user's K labels is flipped with a per-impression budget. `eps/K` is the simple
  even split (pure DP); `tight` is the largest per-impression budget whose *exact* K-fold composition
  is (eps, delta)-DP for the user. With delta > 0 the tight budget is larger, noticeably so at large
  K (less noise for the same user-level guarantee). (`eps/K_i`, each user's own count, is a third
  rule for plans; see the README.)
* **DP-SGD.** With Poisson sampling each of a user's K examples joins a batch independently, so the
  user's contribution is a *mixture of Gaussians* (sensitivity Binomial(K, q)); accounting that
  mixture by PLD is tight. Generic **group privacy** over the example-level guarantee is looser,
  and much looser over RDP.'''),
    ("code", r'''from budgetplan.planning.calibrate import rr_per_example_epsilon

rr_rows = []
for k in RR_CAPS:
    per = rr_per_example_epsilon(epsilon=USER_EPSILON, cap=k, delta=USER_DELTA)
    unit = bp.PrivacyUnit.example() if k == 1 else bp.PrivacyUnit.capped(k)
    # what eps/K actually gives the user: the exact K-fold composition at USER_DELTA
    spent = bp.account(bp.RandomizedResponse(epsilon=per["eps/K"]), delta=USER_DELTA,
                       adjacency="replace-one", unit=unit).epsilon
    rr_rows.append({"K": k, "eps/K": per["eps/K"], "tight": per["tight"],
                    "tight / (eps/K)": per["tight"] / per["eps/K"],
                    "flip prob eps/K": flip_probability(per["eps/K"]),
                    "flip prob tight": flip_probability(per["tight"]),
                    "user eps of eps/K": spent})
print(f"RR per-impression budgets for a user-level ({USER_EPSILON:g}, {USER_DELTA:g}) guarantee")
show_table(rr_rows, list(rr_rows[0]))'''),
    ("code", r'''cli("rr", "--epsilon", USER_EPSILON, "--unit-cap", 10, "--delta", USER_DELTA)'''),
    ("code", r'''dp_rows = []
for k in DPSGD_CAPS:
    unit = bp.PrivacyUnit.example() if k == 1 else bp.PrivacyUnit.capped(k, name="user")
    row = {"K": k}
    for label, kw in (("mixture of Gaussians (PLD)", {"method": "pld"}),
                      ("group privacy over PLD", {"method": "pld", "unit_accounting": "group"}),
                      ("group privacy over RDP", {"method": "rdp", "unit_accounting": "group"})):
        row[label] = bp.account(mech, delta=DELTA, adjacency="add-remove", unit=unit, **kw).epsilon
    dp_rows.append(row)
print(f"DP-SGD user-level epsilon at delta={DELTA:g}: sigma={NOISE_MULTIPLIER:g}, q={Q:.3g}, T={STEPS}")
show_table(dp_rows, list(dp_rows[0]))'''),
    ("code", r'''cli("dpsgd", "--noise-multiplier", NOISE_MULTIPLIER, "--epochs", EPOCHS,
    "--dataset-size", DATASET_SIZE, "--batch-size", BATCH_SIZE, "--delta", DELTA, "--unit-cap", DPSGD_CAPS[-1])'''),
    ("code", r'''# One figure for both tables (matplotlib directly: there is no library plot for this one).
import matplotlib.pyplot as plt
from matplotlib.ticker import NullLocator

fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2), dpi=110)
ks = [r["K"] for r in rr_rows]
left.plot(ks, [r["eps/K"] for r in rr_rows], "o--", label="eps/K")
left.plot(ks, [r["tight"] for r in rr_rows], "o-", label="tight (exact composition)")
left.set(xscale="log", yscale="log", xlabel="K (examples per user)", ylabel="per-impression epsilon",
         title=f"RR: per-impression budget for a ({USER_EPSILON:g}, {USER_DELTA:g}) user")
ks = [r["K"] for r in dp_rows]
for label in list(dp_rows[0])[1:]:
    right.plot(ks, [r[label] for r in dp_rows], "o-", label=label)
right.set(xscale="log", yscale="log", xlabel="K (examples per user)", ylabel=f"user-level epsilon at delta={DELTA:g}",
          title=f"DP-SGD (sigma={NOISE_MULTIPLIER:g}, {EPOCHS} epochs): user-level epsilon")
for ax, ks in ((left, RR_CAPS), (right, DPSGD_CAPS)):
    ax.set_xticks(ks, [str(k) for k in ks])
    ax.xaxis.set_minor_locator(NullLocator())
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
fig.tight_layout()
user_png = WORK / "user_level.png"
fig.savefig(user_png)
plt.close(fig)
display(Image(filename=str(user_png)))'''),
    ("md", r'''## The Hybrid split table

Hybrid spends (eps1, 0) on RR over the labels (the truncated model, non-sensitive features only),
then (eps2, delta) on DP-SGD over the full model, eps1 + eps2 = eps by basic composition. The paper
(v2) varies eps1 = alpha eps for alpha in {0, .25, .5, .75, 1}: alpha = 0 is plain DP-SGD, alpha = 1
plain RR. Each cell: RR's flip probability and DP-SGD's calibrated noise multiplier, at the Criteo
pCTR shape, replace-one (DP-SGD sensitivity 2C). The v1 rule `paper-v1` is eps1 = min(0.6 eps, 3).'''),
    ("code", r'''split_shape = ("--delta", DELTA, "--dataset-size", DATASET_SIZE, "--batch-size", BATCH_SIZE,
               "--epochs", EPOCHS)
cli("split", "--rule", "grid", "--epsilons", ",".join(f"{e:g}" for e in SPLIT_EPSILONS),
    "--alphas", ",".join(f"{a:g}" for a in SPLIT_ALPHAS), *split_shape)'''),
    ("code", r'''from budgetplan.planning.sweep import sweep

cells = sweep(SPLIT_EPSILONS, [f"alpha={a:g}" for a in SPLIT_ALPHAS], delta=DELTA, sampling_rate=Q, steps=STEPS,
              adjacency="replace-one")
show_table(cells, ["epsilon", "rule", "epsilon1", "flip_probability", "epsilon2", "noise_multiplier",
                   "dpsgd_epsilon"])'''),
    ("code", r'''from budgetplan.scenario.split_rules import split_budget

cli("split", "--epsilon", 8, "--rule", "paper-v1", *split_shape)
print("\nPython: paper-v1 at eps = 8 splits into (eps1, eps2) =", split_budget(8.0, "paper-v1"))'''),
    ("md", r'''## Files written

Everything above went into the temporary directory printed at the start.'''),
    ("code", outputs_cell("[curve_png, WORK / \"epsilon_curve_cli.png\", user_png]")),
]

# --------------------------------------------------------------------------------------------
# 02: plan, then train

NB02 = [
    ("md", r'''# Plan, then train: RR, DP-SGD and Hybrid against epsilon

The figure of Chua et al., *Training Differentially Private Ad Prediction Models with
Semi-Sensitive Features*: the relative AUC loss of private models against the total epsilon, for

* **RR**: randomized response on the labels, the *truncated* model (non-sensitive features only;
  RR protects labels, not features) trained on the noisy labels;
* **DP-SGD** on the full model (all features, sensitive ones included);
* **Hybrid**: RR first with (eps1, 0), then DP-SGD with (eps2, delta) on the full model warm-started
  from the RR model, eps1 = alpha eps. alpha = 0 is plain DP-SGD, alpha = 1 plain RR; the paper tunes
  alpha per epsilon over {0, .25, .5, .75, 1}.

All are **semi-sensitive DP** per impression: the non-sensitive features are known to an adversary,
the label and the sensitive features are protected (a replace-one relation, so DP-SGD's sensitivity
is 2C). The relative AUC loss is 100 ((1 - AUC) - (1 - AUC_np)) / (1 - AUC_np) against the
non-private model with all features.

Steps: synthesise data (held-out users for evaluation), train the non-private baselines, write one
scenario per (epsilon, alpha), plan each, train each plan with `execute_plan`, and plot the
frontier. The defaults are small enough for a 2-core CPU in about a minute; the data is synthetic
(`trainers.data.synth`, a known conversion model in which both feature groups carry signal), so the
numbers show the shape of the trade-off, not the paper's values. Everything is written to a
temporary directory.'''),
    ("code", r'''# Parameters: small defaults for a 2-core CPU (about a minute). The paper's sizes, on a GPU:
# ROWS = 40_000_000, USERS = 8_000_000, EPSILONS = (1, 3, 5, 10, 20, 30, 50), DPSGD_BATCH = 16_384,
# RR_EPOCHS = 10, RR_BATCH = 1024, DEVICE = "cuda", MODEL = {} (the trainer's default model sizes).
ROWS = 100_000                    # synthetic impressions (a fifth of the users is held out for evaluation)
USERS = 20_000                    # users; impressions per user are heavy-tailed
SEED = 0                          # the synthetic data's seed (privacy noise always comes from the OS CSPRNG)
EPSILONS = (1.0, 4.0, 16.0)       # total epsilon of each plan
ALPHAS = (0.0, 0.25, 0.5, 0.75, 1.0)  # RR's share: eps1 = alpha eps, eps2 = (1 - alpha) eps
DELTA = "0.1/N"                   # resolved against N when planned: well below 1/N
TOWER = "fine-tune"               # Hybrid's phase 2: "fine-tune" or "frozen" non-sensitive tower
DPSGD_BATCH = 2048                # DP-SGD expected batch size (q = B / N)
DPSGD_EPOCHS = 3
CLIPPING_NORM = 1.0
RR_EPOCHS = 2                     # epochs on the RR labels (post-processing: free)
RR_BATCH = 512
DEVICE = "cpu"                    # "cuda" on a GPU
# Model and optimiser: nothing here changes a privacy guarantee.
MODEL = {"embedding_dim": 4, "tower_hidden": 32, "common_hidden": (32,), "hash_bins_nonsensitive": 2**12,
         "hash_bins_sensitive": 2**12}
LR = 1e-2                         # Adam, baseline and RR phase
DPSGD_LR = 3e-2                   # Adam, DP-SGD phase'''),
    ("code", setup_cell("budgetplan-02-", third_party="import numpy as np\nimport pyarrow.parquet as pq\n")),
    ("md", r'''## Data: synthetic semi-sensitive ads logs, held-out users for evaluation

`budgetplan data synth` writes the built-in synthetic data; `trainers.data.synth.synthesize` returns
the same table in Python (deterministic for a seed). A fixed fifth of the users (by a hash of the
user id) is held out, so no evaluation user's impressions were trained on.'''),
    ("code", r'''cli("data", "synth", "--rows", ROWS, "--users", USERS, "--seed", SEED,
    "--out", WORK / "all.parquet")'''),
    ("code", r'''from trainers.data.synth import SYNTH_FEATURES, synthesize

table = synthesize(ROWS, USERS, SEED)
assert table.equals(pq.read_table(WORK / "all.parquet")), "the CLI and the API disagree"
users = table.column(SYNTH_FEATURES.unit_id).to_numpy().astype(np.uint64)
held_out = (users * np.uint64(0x9E3779B97F4A7C15)) % np.uint64(5) == 0   # multiplicative hash, wrapping
train, test = table.filter(~held_out), table.filter(held_out)
TRAIN, EVAL = WORK / "train.parquet", WORK / "eval.parquet"
pq.write_table(train, TRAIN)
pq.write_table(test, EVAL)
N = train.num_rows
print(f"train {N:,} rows, eval {test.num_rows:,} rows; conversion rate "
      f"{np.mean(table.column('label').to_numpy()):.4f}")
print("non-sensitive:", ", ".join(SYNTH_FEATURES.nonsensitive))
print("sensitive:    ", ", ".join(SYNTH_FEATURES.sensitive))'''),
    ("md", r'''## Scenarios

One TOML scenario per (epsilon, alpha): the budget, replace-one adjacency per impression, N, the
Hybrid algorithm with its split, the training shape that touches privacy (`[rr]`, `[dpsgd]`), and the
`[features]` table (which columns are the label, the user id, and the non-sensitive and sensitive
features), written here by `FeatureSpec.to_toml()` from the synthetic data's spec.'''),
    ("code", r'''def scenario_toml(epsilon, alpha):
    spec = SYNTH_FEATURES
    return f"""name = "hybrid-eps{epsilon:g}-alpha{alpha:g}"
description = "Semi-sensitive DP per impression on synthetic ads data: RR share alpha = {alpha:g}."

[budget]
epsilon = {epsilon!r}
delta = "{DELTA}"

[privacy]
adjacency = "replace-one"
unit = "impression"

[data]
dataset_size = {N}

[algorithm]
name = "hybrid"
split = "alpha={alpha:g}"
tower = "{TOWER}"

[rr]
epochs = {RR_EPOCHS}
batch_size = {RR_BATCH}

[dpsgd]
batch_size = {DPSGD_BATCH}
epochs = {DPSGD_EPOCHS}
clipping_norm = {CLIPPING_NORM!r}

{spec.to_toml()}"""


print(scenario_toml(EPSILONS[0], 0.5))'''),
    ("md", r'''## Plans

`build_plan` splits each budget, calibrates the DP-SGD noise multiplier to (eps2, delta) and the RR
flip probability to eps1, and accounts the whole; the plan file is canonical, hashed JSON. The CLI
does the same from a TOML file (`budgetplan plan`), and gives the same hash. Where RR and DP-SGD
both run, the split is of a run epsilon ("planned to") above the budget: the largest whose PLD
composition of the phases is the budget (`[accounting].composition = "auto"`, the default), so
"guarantee" is that PLD total and each phase draws less noise than if eps1 + eps2 were the budget.'''),
    ("code", r'''from budgetplan.plan import write_atomic
from budgetplan.planning.planner import build_plan
from budgetplan.report.plots import arm_of
from budgetplan.scenario.model import parse_scenario

(WORK / "scenarios").mkdir()
(WORK / "plans").mkdir()
plans, plan_rows = {}, []
for eps in EPSILONS:
    for alpha in ALPHAS:
        text = scenario_toml(eps, alpha)
        (WORK / "scenarios" / f"eps{eps:g}-alpha{alpha:g}.toml").write_text(text)
        plan = build_plan(parse_scenario(text))
        write_atomic(WORK / "plans" / f"eps{eps:g}-alpha{alpha:g}.json", plan.to_json())
        plans[eps, alpha] = plan
        rr, sgd = plan.rr, plan.dpsgd
        plan_rows.append({"epsilon": eps, "alpha": alpha, "arm": arm_of(plan)[0],
                          "flip prob": rr.params.flip_probability if rr else None,
                          "sigma": sgd.params.noise_multiplier if sgd else None,
                          "steps": sgd.params.steps if sgd else None,
                          "planned to": f"{plan.run_epsilon:.4g}",
                          "guarantee": f"({plan.guarantee.epsilon:.4g}, {plan.guarantee.delta:.3g})"})
show_table(plan_rows, list(plan_rows[0]))'''),
    ("code", r'''one = WORK / "scenarios" / f"eps{EPSILONS[1]:g}-alpha0.5.toml"
cli("plan", one, "-o", WORK / "cli-plan.json")
cli("show", WORK / "cli-plan.json")
cli_sha256 = json.loads((WORK / "cli-plan.json").read_text())["sha256"]
print("\nsame plan as build_plan:", cli_sha256 == plans[EPSILONS[1], 0.5].sha256)'''),
    ("md", r'''## Baselines

The non-private model with all features is the reference for the relative AUC loss. The
non-private *truncated* model (non-sensitive features only) is the ceiling RR can reach whatever its
epsilon: RR may not use the sensitive features.'''),
    ("code", r'''from trainers.dpsgd import DPSGDSettings
from trainers.metrics import relative_auc_loss
from trainers.run import RunOptions, TrainSettings, execute_plan, run_baseline

settings = TrainSettings(device=DEVICE, lr=LR, batch_size=RR_BATCH, **MODEL)
dpsgd_settings = DPSGDSettings(optimizer="adam", lr=DPSGD_LR)
RUNS = WORK / "runs"
any_plan = plans[EPSILONS[0], ALPHAS[0]]   # a baseline reads only the plan's feature spec
base = run_baseline(any_plan, TRAIN, eval_path=EVAL, out_dir=RUNS / "non-private", settings=settings)
ceiling = run_baseline(any_plan, TRAIN, eval_path=EVAL, out_dir=RUNS / "non-private-truncated", settings=settings,
                       truncated=True)
BASE_AUC = base.metrics["eval"]["auc"]
CEILING_AUC = ceiling.metrics["eval"]["auc"]
print(f"non-private AUC {BASE_AUC:.4f}; non-sensitive features only {CEILING_AUC:.4f}, a relative AUC loss of "
      f"{relative_auc_loss(CEILING_AUC, BASE_AUC):.2f}%: the floor of any RR model")'''),
    ("md", r'''## Train every plan

`execute_plan` refuses a plan that does not verify or data whose size is not the plan's N, then runs
the phases exactly as planned (RR labels flipped once from the OS CSPRNG; DP-SGD with Poisson
sampling, per-example clipping and the planned noise) and writes a hashed run record with the plan
beside it. `TrainSettings` and `DPSGDSettings` hold only what cannot change a guarantee.'''),
    ("code", r'''import time

run_dirs = []
t0 = time.perf_counter()
for (eps, alpha), plan in plans.items():
    out = RUNS / f"eps{eps:g}-alpha{alpha:g}"
    record = execute_plan(plan, TRAIN, RunOptions(eval_path=EVAL, out_dir=out, settings=settings,
                                                  dpsgd_settings=dpsgd_settings, baseline_auc=BASE_AUC))
    run_dirs.append(out)
    ev = record.metrics["eval"]
    print(f"eps {eps:>4g}  alpha {alpha:<4g}  AUC {ev['auc']:.4f}  relative AUC loss {ev['relative_auc_loss']:6.2f}%  "
          f"({record.timings['total_seconds']:.1f} s)")
print(f"{len(run_dirs)} runs in {time.perf_counter() - t0:.0f} s")'''),
    ("code", r'''# The same from the CLI, for one plan (written to a separate directory, not part of the figure).
# The CLI trains its default tower sizes, so the baseline above (MODEL) is not this model's
# ceiling: --baseline would refuse it. A ceiling for it is `train --non-private` with the same options.
cli("train", WORK / "plans" / f"eps{EPSILONS[1]:g}-alpha1.json", "--data", TRAIN, "--eval", EVAL,
    "--out", WORK / "cli-run", "--embedding-dim", 4, "--lr", LR, "--device", DEVICE)'''),
    ("md", r'''## The frontier

`frontier` reads each run directory (record and plan) and returns one row per run with its arm
(RR, DP-SGD or Hybrid, from the plan's phases), epsilon and relative AUC loss. For the Hybrid curve
the paper keeps, at each epsilon, the best alpha; we do the same. Note that choosing alpha on
evaluation data is hyperparameter tuning, which the plans above do not account (declare `[tuning]`
in a scenario to pay for it).'''),
    ("code", r'''from budgetplan.report.plots import frontier, plot_frontier

rows = frontier(run_dirs)
for r in rows:
    r["run"] = Path(r["run"]).name
show_table(sorted(rows, key=lambda r: (r["epsilon"], r["alpha"])),
           ["run", "arm", "epsilon", "alpha", "auc", "relative_auc_loss"])'''),
    ("code", r'''# The paper's figure: RR (alpha = 1), DP-SGD (alpha = 0) and Hybrid with the best alpha per epsilon.
paper_rows = [r for r in rows if r["arm"] in ("RR", "DP-SGD")]
for eps in EPSILONS:
    best = min((r for r in rows if r["epsilon"] == eps), key=lambda r: r["relative_auc_loss"])
    paper_rows.append({**best, "arm": "Hybrid (best alpha)"})
    print(f"eps {eps:g}: best alpha {best['alpha']:g} ({best['relative_auc_loss']:.2f}%)")
frontier_png = plot_frontier(paper_rows, WORK / "frontier.png",
                             title=f"relative AUC loss against epsilon (synthetic, N={N:,}, lower is better)")
display(Image(filename=str(frontier_png)))'''),
    ("md", r'''What to look for, as in the paper: RR cannot get below the loss of the non-private truncated
model (printed with the baselines), however large epsilon is; DP-SGD improves steadily with epsilon;
Hybrid gains most at moderate and large epsilon, where RR's labels are accurate enough to give DP-SGD
a good starting point, and little or nothing at small epsilon. Each point here is one run of a small
model on a small synthetic dataset, so run-to-run noise is several points of relative loss: raise `ROWS`
(and train on a GPU) for smoother curves.'''),
    ("code", r'''# The CLI draws the frontier from the run directories too. Given every run, Hybrid's point is the
# mean over alpha = .25, .5, .75 and its bar their spread.
cli("plot", "frontier", *run_dirs, "-o", WORK / "frontier_cli.png")
display(Image(filename=str(WORK / "frontier_cli.png")))'''),
    ("md", r'''## Files written'''),
    ("code", outputs_cell("[frontier_png, WORK / \"frontier_cli.png\"]")),
]

# --------------------------------------------------------------------------------------------
# 03: audit a run

NB03 = [
    ("md", r'''# Audit a run: is the promised guarantee true of what actually ran?

A plan promises (eps, delta); a run record says what the trainer did. The auditor fails closed:
evidence a check needs and cannot find is a failing check that names it. Each check is named and
independent:

1. **plan verifies**: the plan's hash and schema hold and every number recomputes;
2. **record is well-formed**: the public record (and the data owner's private one) read strictly;
3. **record names the plan**: its plan hash, algorithm, N and exactly the plan's phases;
4. **ledger**: the write-ahead ledger's hash chain, its end, and one release per one-shot phase;
5. **steps within plan**: DP-SGD took no more noisy steps than planned, as the ledger counts them;
6. **DP-SGD noise**: the plan's sigma, C and q, with noise on every parameter at every step;
7. **Poisson batch sizes**: every step's batch size (from the ledger, all sessions) is consistent
   with Poisson sampling at q (total and spread; fixed-size or shuffled batches fail);
8. **RR flips**: the number of flipped labels is consistent with the planned flip probability;
9. **WALR release** (WALR plans) and **independent re-accounting**: every phase re-accounted by a
   different path agrees; **data fingerprint** with the data and the owner's key.

`--empirical` runs the trainer's own training loops on canaries and neighbouring inputs.

This notebook trains one small Hybrid run, audits it, reads its run statement, runs the empirical
tests, then shows what a tampered plan and an over-long run look like to the auditor. Everything is
written to a temporary directory.'''),
    ("code", r'''# Parameters: a small run for a 2-core CPU (seconds). The paper's sizes, on a GPU:
# ROWS = 40_000_000, USERS = 8_000_000, DPSGD_BATCH = 16_384, DPSGD_EPOCHS = 3, RR_EPOCHS = 10,
# DEVICE = "cuda" (the audit itself costs the same at any size; the empirical tests run on CPU).
ROWS = 20_000
USERS = 4_000
SEED = 1                   # the synthetic data's seed
EPSILON = 4.0              # total budget
ALPHA = 0.5                # RR's share of it
DELTA = "0.1/N"
DPSGD_BATCH = 1_000
DPSGD_EPOCHS = 2
RR_EPOCHS = 1
DEVICE = "cpu"
EXTRA_STEPS = 10           # the forged record claims this many DP-SGD steps beyond the plan
RR_SAMPLES = 1_000_000     # labels per neighbour in the RR measurement figure (the audit uses 5M)'''),
    ("code", setup_cell("budgetplan-03-", stdlib="import shutil\n", third_party="import pyarrow.parquet as pq\n")),
    ("md", r'''## Plan and train a small Hybrid run'''),
    ("code", r'''from budgetplan.planning.planner import build_plan
from budgetplan.scenario.model import parse_scenario
from trainers.data.synth import SYNTH_FEATURES, synthesize
from trainers.run import RunOptions, TrainSettings, execute_plan

DATA = WORK / "train.parquet"
pq.write_table(synthesize(ROWS, USERS, SEED), DATA)


spec = SYNTH_FEATURES
scenario = f"""name = "audit-hybrid-eps{EPSILON:g}"
description = "A small Hybrid run (RR then DP-SGD) on synthetic ads data, to audit."

[budget]
epsilon = {EPSILON!r}
delta = "{DELTA}"

[privacy]
adjacency = "replace-one"
unit = "impression"

[data]
dataset_size = {ROWS}

[algorithm]
name = "hybrid"
split = "alpha={ALPHA:g}"

[rr]
epochs = {RR_EPOCHS}
batch_size = 1024

[dpsgd]
batch_size = {DPSGD_BATCH}
epochs = {DPSGD_EPOCHS}
clipping_norm = 1.0

{spec.to_toml()}"""
plan = build_plan(parse_scenario(scenario))
for phase in plan.phases:
    keys = ("flip_probability", "noise_multiplier", "steps", "sampling_rate")
    print(phase.name, {k: getattr(phase.params, k) for k in keys if hasattr(phase.params, k)})
RUN = WORK / "runs" / "hybrid"
record = execute_plan(plan, DATA, RunOptions(out_dir=RUN, settings=TrainSettings(device=DEVICE, embedding_dim=4,
                                                                                 tower_hidden=32, common_hidden=(32,))))
print("run directory:", sorted(p.name for p in RUN.iterdir()))'''),
    ("md", r'''## The audit

`audit_run` returns a report of named checks; `budgetplan audit` prints it and exits 0 when every
check holds, 1 otherwise. `budgetplan.audit.audit_run` reads the plan, the record and the ledger
alone; `trainers.audit.audit_run` runs those checks and then the ones that need the data or
torch: with the data at hand, the fingerprint is recomputed too.'''),
    ("code", r'''from trainers.audit import audit_run


def print_report(report):
    print("PASSED" if report.passed else f"FAILED: {', '.join(report.failing())}")
    for c in report.checks:
        print(f"  [{'pass' if c.passed else 'FAIL'}] {c.name}: {c.detail}")
    for e in report.empirical:
        print(f"  [{'pass' if e['passed'] else 'FAIL'}] {e['name']}: epsilon >= {e['epsilon_lower_bound']:.4f} "
              f"measured, {e['planned_epsilon']:.4f} planned ({e['samples']:,} samples, {e['seconds']:.1f} s)")


report = audit_run(RUN, data_path=DATA)
print_report(report)'''),
    ("code", r'''cli("audit", RUN, "--data", DATA)'''),
    ("md", r'''## The run statement

What actually ran (labels flipped, steps taken, batch sizes, noise drawn, randomness) from the
public record, what the data owner's private record holds (data fingerprint, clipped fraction,
metrics on private labels: statistics the guarantee does not cover), then the plan's privacy
statement.'''),
    ("code", r'''from budgetplan.record.records import load_record
from budgetplan.report.statement import render_run_statement

statement = render_run_statement(plan, load_record(RUN))
print(statement)'''),
    ("code", r'''cli("statement", RUN / "run.json", head=12)
print("\nCLI and Python agree:", run_cli("statement", RUN / "run.json").stdout.strip() == statement.strip())'''),
    ("md", r'''## Empirical lower bounds on epsilon

The accounting is only as good as the code that draws the noise. `empirical=True` runs the trainer's
own training loops (the RR phase, the DP-SGD loop over all its steps, WALR's release) on
neighbouring inputs and canaries, and turns the observed frequencies into a lower bound on epsilon
(Clopper-Pearson, valid with probability 1 - 1e-6). A lower bound above the plan means the code is
less private than planned. RR's bound is tight (within 0.05 of its epsilon); DP-SGD's is far from
tight (about 1.5-1.9 of 4.4 at the README plan), so each phase also runs mechanism checks (noise std
at every step, noise independent across steps, a canary moves by C at rate q, the flip rate) that
catch wrong noise, clipping or normalisation; any failing check fails the audit.'''),
    ("code", r'''report = audit_run(RUN, empirical=True)
print_report(report)'''),
    ("code", r'''cli("audit", RUN, "--empirical")'''),
    ("code", r'''# trainers.empirical directly: the measured epsilon of the real label-flipping code against the
# planned one, and of a buggy "mutant" that flips half as often as planned (less private than claimed).
import matplotlib.pyplot as plt

from budgetplan.accounting.rr import flip_probability
from trainers import empirical
from trainers.rr_phase import randomize_labels


def mutant(labels, rho, randomness):
    return randomize_labels(labels, rho / 2, randomness)


measured = []
for eps in (0.5, 1.0, 2.0, 3.0):
    ok = empirical.rr_lower_bound(epsilon=eps, samples=RR_SAMPLES)
    bad = empirical.rr_lower_bound(epsilon=eps, samples=RR_SAMPLES, flip=mutant)
    measured.append({"planned": eps, "flip prob": flip_probability(eps), "trainer's code": ok.epsilon_lower_bound,
                     "mutant": bad.epsilon_lower_bound, "mutant caught": bad.epsilon_lower_bound > eps})
show_table(measured, list(measured[0]))

fig, ax = plt.subplots(figsize=(6, 4.2), dpi=110)
xs = [m["planned"] for m in measured]
ax.plot(xs, xs, "k:", label="planned (bound may not exceed it)")
ax.plot(xs, [m["trainer's code"] for m in measured], "o-", label="trainer's RR: measured lower bound")
ax.plot(xs, [m["mutant"] for m in measured], "s--", label="mutant (flips rho/2): measured lower bound")
ax.set(xlabel="planned per-impression epsilon", ylabel="epsilon", title="RR measured against plan")
ax.grid(alpha=0.3)
ax.legend(fontsize=8)
fig.tight_layout()
empirical_png = WORK / "rr_empirical.png"
fig.savefig(empirical_png)
plt.close(fig)
display(Image(filename=str(empirical_png)))'''),
    ("md", r'''## A tampered plan

Someone halves the RR flip probability in `plan.json` (a better model, the same claimed epsilon).
The plan's sha256 no longer matches its content: `verify`, `audit` and every loader refuse it, naming
the mismatch.'''),
    ("code", r'''TAMPERED = WORK / "runs" / "tampered"
shutil.copytree(RUN, TAMPERED)
rho = plan.phases[0].params.flip_probability
plan_text = (TAMPERED / "plan.json").read_text()
assert plan_text.count(f'"flip_probability": {rho!r}') == 1
plan_text = plan_text.replace(f'"flip_probability": {rho!r}', f'"flip_probability": {rho / 2!r}')
(TAMPERED / "plan.json").write_text(plan_text)
print(f"flip_probability {rho!r} -> {rho / 2!r}")
cli("verify", TAMPERED / "plan.json", ok=(1,))
cli("audit", TAMPERED, ok=(1,))'''),
    ("code", r'''from budgetplan.errors import BudgetplanError

try:
    audit_run(TAMPERED)
except BudgetplanError as exc:
    print(f"audit_run refused it: {type(exc).__name__}: {exc}")
else:
    raise AssertionError("a tampered plan was accepted")'''),
    ("md", r'''## An over-long run

A forger who knows the record format claims more DP-SGD steps than the plan holds and re-hashes the
record, so the record itself loads. The audit still fails: **steps within plan** names the excess
and the write-ahead ledger's own count, and the re-accounting of the steps executed exceeds the
phase budget. (Editing the record without re-hashing it fails earlier: its sha256 no longer matches.)'''),
    ("code", r'''import hashlib
import json

from budgetplan.plan import canonical_json


def rehash(content):
    """What a forger who knows the format does: recompute the record's sha256."""
    digest = hashlib.sha256(canonical_json(content).encode("ascii")).hexdigest()
    return json.dumps({**content, "sha256": digest}, sort_keys=True, indent=2) + "\n"


content = load_record(RUN).content()
dpsgd_phase = next(p for p in content["phases"] if p["name"] == "dpsgd")
print(f"steps executed {dpsgd_phase['steps_executed']} -> {dpsgd_phase['steps_executed'] + EXTRA_STEPS} "
      f"(planned {plan.dpsgd.params.steps})")
dpsgd_phase["steps_executed"] += EXTRA_STEPS
OVERLONG = WORK / "runs" / "overlong"
shutil.copytree(RUN, OVERLONG)
(OVERLONG / "run.json").write_text(rehash(content))

overlong = audit_run(OVERLONG)
print_report(overlong)
assert not overlong.passed and "steps within plan" in overlong.failing()'''),
    ("code", r'''cli("audit", OVERLONG, ok=(1,))'''),
    ("md", r'''## Missing evidence fails

The audit fails closed: a record that leaves out what a check needs does not pass by omission. Here
the forger drops the RR phase from the record (so there is no flip count to test) and re-hashes it:
**record names the plan** and **RR flips** both fail, naming what is missing.'''),
    ("code", r'''content = load_record(RUN).content()
content["phases"] = [p for p in content["phases"] if p["name"] != "rr"]
MISSING = WORK / "runs" / "missing-phase"
shutil.copytree(RUN, MISSING)
(MISSING / "run.json").write_text(rehash(content))
missing = audit_run(MISSING)
print_report(missing)
assert {"record names the plan", "RR flips"} <= set(missing.failing())'''),
    ("md", r'''## Files written'''),
    ("code", outputs_cell("[empirical_png]")),
]

NOTEBOOKS = {
    "01_plan_a_budget.ipynb": NB01,
    "02_plan_then_train.ipynb": NB02,
    "03_audit_a_run.ipynb": NB03,
}


def build(cells, stem: str):
    nb = nbformat.v4.new_notebook()
    nb.metadata = {
        "kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
    }
    for i, (kind, source) in enumerate(cells):
        source = source.strip("\n")
        cell = nbformat.v4.new_markdown_cell(source) if kind == "md" else nbformat.v4.new_code_cell(source)
        cell.id = f"{stem}-{i:02d}"
        nb.cells.append(cell)
    nbformat.validate(nb)
    return nb


def render(name: str) -> str:
    return nbformat.writes(build(NOTEBOOKS[name], name[:2]), version=4) + "\n"


def main() -> int:
    for name in NOTEBOOKS:
        (HERE / name).write_text(render(name), encoding="utf-8")
        print("wrote", HERE / name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
