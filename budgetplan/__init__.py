"""budgetplan: plan, execute and audit differential-privacy budgets for ads models.

The planning core never imports torch: ``import budgetplan`` stays light (a test enforces it).
"""

from typing import TYPE_CHECKING

from budgetplan.util.lazy import lazy_exports
from budgetplan.version import __version__

# Public names resolve lazily (PEP 562): `budgetplan --help` must not pay for scipy and the
# accounting back-ends, and `import budgetplan` must never import torch.
_EXPORTS = {
    "account": "budgetplan.accounting.account",
    "account_phases": "budgetplan.accounting.account",
    "Guarantee": "budgetplan.accounting.guarantee",
    "Calibration": "budgetplan.planning.calibrate",
    "dpsgd_noise_multiplier": "budgetplan.planning.calibrate",
    "dpsgd_max_steps": "budgetplan.planning.calibrate",
    "dpsgd_min_dataset_size": "budgetplan.planning.calibrate",
    "gaussian_noise_std": "budgetplan.planning.calibrate",
    "rr_per_example_epsilon": "budgetplan.planning.calibrate",
    "steps_for_epochs": "budgetplan.planning.calibrate",
    "Adjacency": "budgetplan.units",
    "PrivacyUnit": "budgetplan.units",
    "RandomizedResponse": "budgetplan.mechanisms",
    "GaussianRelease": "budgetplan.mechanisms",
    "PoissonDPSGD": "budgetplan.mechanisms",
    "TruncatedPoissonDPSGD": "budgetplan.mechanisms",
    "UnitPoissonDPSGD": "budgetplan.mechanisms",
    "AllocationDPSGD": "budgetplan.mechanisms",
    "ShuffledDPSGD": "budgetplan.mechanisms",
    "Composition": "budgetplan.mechanisms",
    "BudgetplanError": "budgetplan.errors",
    "InvalidParameterError": "budgetplan.errors",
    "UnsupportedError": "budgetplan.errors",
    "InfeasibleError": "budgetplan.errors",
    "AccountingError": "budgetplan.errors",
}

__all__ = ["__version__", *_EXPORTS]


if TYPE_CHECKING:  # what the lazy names resolve to, for type checkers (nothing is imported at run time)
    from budgetplan.accounting.account import account as account
    from budgetplan.accounting.account import account_phases as account_phases
    from budgetplan.accounting.guarantee import Guarantee as Guarantee
    from budgetplan.errors import AccountingError as AccountingError
    from budgetplan.errors import BudgetplanError as BudgetplanError
    from budgetplan.errors import InfeasibleError as InfeasibleError
    from budgetplan.errors import InvalidParameterError as InvalidParameterError
    from budgetplan.errors import UnsupportedError as UnsupportedError
    from budgetplan.mechanisms import AllocationDPSGD as AllocationDPSGD
    from budgetplan.mechanisms import Composition as Composition
    from budgetplan.mechanisms import GaussianRelease as GaussianRelease
    from budgetplan.mechanisms import PoissonDPSGD as PoissonDPSGD
    from budgetplan.mechanisms import RandomizedResponse as RandomizedResponse
    from budgetplan.mechanisms import ShuffledDPSGD as ShuffledDPSGD
    from budgetplan.mechanisms import TruncatedPoissonDPSGD as TruncatedPoissonDPSGD
    from budgetplan.mechanisms import UnitPoissonDPSGD as UnitPoissonDPSGD
    from budgetplan.planning.calibrate import Calibration as Calibration
    from budgetplan.planning.calibrate import dpsgd_max_steps as dpsgd_max_steps
    from budgetplan.planning.calibrate import dpsgd_min_dataset_size as dpsgd_min_dataset_size
    from budgetplan.planning.calibrate import dpsgd_noise_multiplier as dpsgd_noise_multiplier
    from budgetplan.planning.calibrate import gaussian_noise_std as gaussian_noise_std
    from budgetplan.planning.calibrate import rr_per_example_epsilon as rr_per_example_epsilon
    from budgetplan.planning.calibrate import steps_for_epochs as steps_for_epochs
    from budgetplan.units import Adjacency as Adjacency
    from budgetplan.units import PrivacyUnit as PrivacyUnit


__getattr__, __dir__ = lazy_exports("budgetplan", _EXPORTS, globals(), __all__)
