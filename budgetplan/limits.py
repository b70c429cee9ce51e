"""Stated limits: the largest sizes budgetplan accepts, so that any input means bounded work.

Every entry point (scenario keys, CLI options) refuses a value beyond its limit with one
line naming the key and the largest accepted value, instead of planning silently on a
typo or running for hours. Each limit is far above any real use and says why it is where
it is; raising one is a reviewed change, not a flag.
"""

from __future__ import annotations

__all__ = [
    "MAX_DATASET_SIZE",
    "MAX_EPOCHS",
    "MAX_UNIT_CAP",
    "MAX_PLOT_POINTS",
    "MAX_CURVES",
    "MAX_SYNTH_ROWS",
    "MAX_EMBEDDING_DIM",
    "MAX_HASH_BINS",
    "MAX_WEIGHT_DECAY",
    "MAX_LEARNING_RATE",
    "MAX_GRID_CELLS",
    "MAX_WALR_FEATURES",
    "MAX_CONFIGURATIONS",
    "MAX_STEPS",
    "MAX_THREADS",
    "MAX_PROCESSES",
    "MAX_TEXT_CHARS",
    "MAX_CALIBRATION_EPSILON",
]

# N, rows after capping. A trillion is 200x the largest public ads log (Criteo's 1TB click
# logs hold about 4.4e9 rows); beyond 2**53 (9e15) counts stop being exact in the float64
# arithmetic that q = B/N and delta = c/N go through.
MAX_DATASET_SIZE = 10**12

# Passes over the data, for RR and DP-SGD alike. Published ads models train for 1 to 100;
# ten thousand passes is a typo, and steps = epochs N / B must stay a count the
# accountants compose in bounded time.
MAX_EPOCHS = 10_000

# K, the most examples one unit (a user over a time window) keeps after capping. The
# eps/K_i rule keeps one flip probability per count 1..K in the plan, so the plan grows
# with K; a unit of more than 100,000 impressions is a unit in name only.
MAX_UNIT_CAP = 100_000

# Points along one `plot curve` curve, and curves in one figure: each point is an accounting.
MAX_PLOT_POINTS = 1_000
MAX_CURVES = 50

# Rows of synthetic data: synthesize builds the whole table in memory (about 50 bytes a row,
# so 5 GB here) before it is written.
MAX_SYNTH_ROWS = 10**8

# Embedding width: the two hashed embedding tables have 2**16 rows each by default, so 1024
# columns are already 2 x 256 MiB of float32 parameters (and as much again for Adam's moments).
MAX_EMBEDDING_DIM = 1_024

# Rows of a hashed embedding table (--hash-bins). The Hybrid paper uses 50,000 to 100,000;
# 2**24 (16.8M) rows at width 8 are 512 MiB per table before the optimiser's copies, and
# beyond it the tables outgrow any categorical vocabulary of a tabular ads log.
MAX_HASH_BINS = 2**24

# Adam's L2 weight decay for the non-private baseline. At 1 the penalty on unit-sized weights
# outweighs the whole log loss (about 0.7 per example at most); useful values are 1e-6 to 1e-3.
MAX_WEIGHT_DECAY = 1.0

# Learning rates (Adam, momentum SGD): training diverges far below this; beyond it the loss
# overflows and the run ends with nothing to record.
MAX_LEARNING_RATE = 10.0

# k, WALR's columns (intercept included): its one release is a k-vector, and the fit after
# it holds N x k numbers; tabular ads models have tens to thousands of numeric columns.
MAX_WALR_FEATURES = 1_000_000

# Hyperparameter configurations whose selection a plan accounts: searches run tens to
# hundreds; naive tuning splits the budget this many ways.
MAX_CONFIGURATIONS = 10_000

# Cells of a `split --rule grid` table (total epsilons x alphas): each is a calibration.
MAX_GRID_CELLS = 200

# Noisy DP-SGD steps a mechanism may describe: the count must stay an exact float64 integer
# for the back-ends (2**53 is 9e15), and 10^15 steps at a millisecond each are 30,000 years.
MAX_STEPS = 10**15

# CPU threads torch may use in a run. The largest machines have a few hundred cores; more
# threads than that only oversubscribe them.
MAX_THREADS = 1_024
# Processes of one distributed run (--nproc, torchrun's world): beyond this, a typo.
MAX_PROCESSES = 1_024

# Characters in a scenario's free text (name, description, split_evidence): each is copied into
# the plan, its statement and every run record. A 20 MB name took 10 s and 0.5 GB to plan (on a
# loaded 2-core machine); a name is a line and a description a paragraph.
MAX_TEXT_CHARS = 10_000

# Largest epsilon a noise multiplier is calibrated for (`dpsgd --epsilon`, `split`, a scenario
# without a fixed noise multiplier). Past it the noise searched for is so small that every PLD
# evaluation runs at the grid limits: on a loaded 2-core machine (N 10,000, B 256, 10 steps)
# epsilon 100 took 10 s, 200 ran past 300 s and 1000 took 200 s; no privacy plan needs it.
MAX_CALIBRATION_EPSILON = 100.0

# Noise multipliers a calibration searches between (the scenario refuses a given one outside them).
SIGMA_RANGE = (1e-3, 1e4)
