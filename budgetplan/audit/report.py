"""What an audit reports: named checks, each passed or failed with its reason."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

ALPHA = 1e-6                 # false-alarm rate of each statistical test



REACCOUNT_TOLERANCE = 1e-3   # relative agreement required between independent accountings



@dataclass(frozen=True)
class Check:
    name: str
    passed: bool
    detail: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "passed", bool(self.passed))  # numpy booleans are not JSON



INTERRUPTED = "run completed"  # the check an interrupted run fails: there is nothing to certify yet


@dataclass
class AuditReport:
    """The checks of one run, and the guarantee they are of.

    Attributes:
        epsilon, delta, adjacency: the plan's guarantee, which the run is audited against
            (top-level in the JSON, like every JSON object the CLI prints).
        seeded: the run drew from a seed its record publishes: even when every check passes,
            its noise is reproducible by anyone holding the record, so it is not certified
            as private (``budgetplan.audit.evidence``).
    """

    record: str
    plan_sha256: str | None
    status: str = "completed"
    checks: list[Check] = field(default_factory=list)
    empirical: list[dict[str, Any]] = field(default_factory=list)
    epsilon: float | None = None
    delta: float | None = None
    adjacency: str | None = None
    seeded: bool = False

    @property
    def passed(self) -> bool:
        return bool(self.checks) and all(c.passed for c in self.checks) and all(e["passed"] for e in self.empirical)

    @property
    def nothing_to_certify(self) -> bool:
        """An interrupted run that fails nothing but having no record yet (the CLI's distinct exit code)."""
        return self.status == "interrupted" and self.failing() == [INTERRUPTED]

    def failing(self) -> list[str]:
        return [c.name for c in self.checks if not c.passed] + [e["name"] for e in self.empirical if not e["passed"]]

    def to_dict(self) -> dict[str, Any]:
        return {"passed": self.passed, "status": self.status, "epsilon": self.epsilon, "delta": self.delta,
                "adjacency": self.adjacency, "seeded": self.seeded, "record": self.record,
                "plan_sha256": self.plan_sha256, "alpha": ALPHA, "tolerance": REACCOUNT_TOLERANCE,
                "checks": [c.__dict__ for c in self.checks], "empirical": self.empirical,
                "failing": self.failing()}
