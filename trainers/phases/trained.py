"""What a run keeps when its phases train the torch model: the model, described and evaluated for the record."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from budgetplan.record.parts import ModelInfo, json_table
from trainers.outputs import evaluate

__all__ = ["TrainedModel"]


@dataclass
class TrainedModel:
    """The run's torch model after its last training phase (``truncated``: after RR, non-sensitive features only)."""

    model: Any
    settings: Any
    dpsgd_settings: Any  # None unless the plan has a DP-SGD phase
    vocabulary: dict | None
    truncated: bool
    compares_baseline = True
    reports_sizes = True

    @classmethod
    def of(cls, context, *, truncated: bool, dpsgd_settings) -> TrainedModel:
        return cls(context.model, context.settings, dpsgd_settings, context.prep.vocabulary, truncated)

    def state(self) -> dict:
        return self.model.state_dict()

    def describe(self) -> ModelInfo:
        return ModelInfo(kind=self.settings.model, config=json_table("model.config", self.model.config()),
                         final="truncated" if self.truncated else "full")

    def training(self) -> dict:
        dpsgd = self.dpsgd_settings
        return {**self.settings.to_dict(), "dpsgd": dpsgd.to_dict() if dpsgd is not None else None}

    def evaluate(self, eval_prep, eval_path) -> tuple[dict, float]:
        return evaluate(self.model, eval_prep, eval_path, truncated=self.truncated)
