"""The phase executors, every kind registered: what ``trainers.run`` and ``trainers.tune`` dispatch through.

Importing this module imports each kind's module of ``trainers.phases`` (which registers its
executor with ``register_executor``); a new kind is a new module there and its line here.
"""

from __future__ import annotations

from trainers.phases import calibration, count, dpsgd, rr, walr  # noqa: F401  (each registers its executor)
from trainers.phases.registry import (
    REGISTRY,
    Entry,
    Executor,
    FinalModel,
    PhaseContext,
    check_executable,
    check_phases,
    data_needs,
    executes_torch_model,
    executor_for,
    register_executor,
    run_phases,
)

__all__ = ["REGISTRY", "Entry", "Executor", "FinalModel", "PhaseContext", "check_executable", "check_phases",
           "data_needs", "executes_torch_model", "executor_for", "register_executor", "run_phases"]
