"""The work limits of the accounting engine, in one place.

Every input that would need more memory or time than these is either refused up front with
a one-line error naming the parameter and the value that would work, or (``account`` and the
calibrations) handled on a coarser PLD grid, which is still a pessimistic upper bound and is
reported in the guarantee's ``discretization`` and notes. The memory figures are float64
arrays; the engine holds a handful of such arrays at once, so its peak is a few times the
figure quoted.
"""

from __future__ import annotations

__all__ = [
    "MAX_SINGLE_GRID_POINTS",
    "MAX_GRID_POINTS",
    "MAX_MIXTURE_WORK",
    "MAX_MIXTURE_ATOMS",
    "MAX_COMPOSITIONS",
    "MIN_PLD_DELTA",
    "MAX_DISCRETIZATION",
    "MAX_GAUSSIAN_RATIO",
    "MAX_RR_COUNT",
    "MAX_STEPS",
    "MAX_CALIBRATION_EPSILON",
]

# Losses on the grid of one step (connect-the-dots): 4M points, 32 MiB per array; building
# the pmf holds about a dozen arrays of that length (~0.4 GiB).
MAX_SINGLE_GRID_POINTS = 1 << 22

# Losses on the grid of a composition (the FFT length): 8M points, 64 MiB per array; the
# tilted FFT composition holds about six (~0.4 GiB) and takes about a second on 2 cores.
MAX_GRID_POINTS = 1 << 23

# Mixture-of-Gaussians atoms times single-step grid points: 2^26 (atom, loss) pairs. The
# Newton solve for the inverse loss is chunked to 32 MiB temporaries, so this bounds time
# (about a minute), not memory.
MAX_MIXTURE_WORK = 1 << 26

# Sensitivities of one mixture-of-Gaussians step kept after its binomial tails (beyond
# delta / 1000 per run) are moved to infinity: 65,536 atoms, i.e. at least 1,024 grid points
# within MAX_MIXTURE_WORK. A unit cap K needs about 80 sqrt(K q (1 - q)) of them.
MAX_MIXTURE_ATOMS = 1 << 16

# Compositions of one pmf (DP-SGD steps, RR copies) the PLD engine accepts. The FFT rounding
# bound grows linearly with the count (the tilt has to grow to keep its share of delta near
# 1e-5), and beyond this the grid any useful epsilon needs is far past MAX_GRID_POINTS.
MAX_COMPOSITIONS = 10**9

# The smallest delta a PLD epsilon is certified at. The tilted FFT keeps its rounding
# allowance near 1e-5 of delta at any delta, but below this the tilt has to jump across the
# heavy remove-direction tail of subsampled Gaussians and PLD can come out looser than RDP;
# such deltas are refused (RDP accepts any delta).
MIN_PLD_DELTA = 1e-30

# Coarsest PLD grid: one step's loss is rounded up by at most this much. Past it the grid
# arithmetic (e^discretization) is no longer meaningful; such mechanisms (noise far below
# the sensitivity) are refused, naming RDP.
MAX_DISCRETIZATION = 100.0

# Largest sensitivity / noise-std ratio of a Gaussian release accounted in closed form:
# epsilon grows like ratio^2 / 2, which overflows float64 past ~1e154.
MAX_GAUSSIAN_RATIO = 1e100

# Largest number of randomized-response copies per unit (the unit cap K). The exact binomial
# accounting only builds a window of Binomial(K, rho) (about 20 to 75 standard deviations),
# itself limited to 4M terms (32 MiB), which binds first for K beyond ~1e11.
MAX_RR_COUNT = 10**15

# Largest number of DP-SGD steps any method accepts, and largest epsilon a noise multiplier is
# calibrated for: stated with the other input limits.
from budgetplan.limits import MAX_CALIBRATION_EPSILON, MAX_STEPS  # noqa: E402
