"""budgetplan: plan, execute and audit differential-privacy budgets for ads models.

The planning core never imports torch: ``import budgetplan`` stays light (a test enforces it).
"""

__version__ = "0.1.0"

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


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'budgetplan' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(__all__)
