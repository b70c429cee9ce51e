"""The plain-language privacy statement of a plan: what an auditor files.

Deterministic text (the same plan gives the same bytes; golden tests pin one per shipped
example), wrapped at 88 columns, in this order: the guarantee in one sentence; what is
protected (unit, adjacency); each mechanism with its parameters; how the phases compose;
the accountants, their versions and that the bounds are pessimistic; the assumptions the
guarantee rests on (sampling, capping, clipping, checkpoints); what it does not cover;
numerical caveats; the plan hash.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Callable, Mapping
from typing import Any, TypeAlias, TypeVar

from budgetplan.accounting.guarantee import Guarantee
from budgetplan.errors import PlanMismatchError, UnsupportedError
from budgetplan.plan import Plan
from budgetplan.plan.parts import UnitAlternative
from budgetplan.plan.phases import CalibrationPhase, CountPhase, DPSGDPhase, Phase, RRPhase, UnitPart, WALRPhase
from budgetplan.planning.composition import plan_tradeoff, unit_parts
from budgetplan.record.records import (
    CalibrationRun,
    CalibrationStats,
    DPSGDRun,
    DPSGDStats,
    PhaseRun,
    PhaseStats,
    PrivateRecord,
    RRRun,
    RRStats,
    RunRecord,
    WALRRun,
    WALRStats,
)
from budgetplan.scenario.split_rules import SplitChoice
from budgetplan.units import Adjacency

__all__ = ["render_statement", "render_run_statement", "describes", "describes_entry"]

_WIDTH = 88


def _num(x: float | None, digits: int = 6) -> str:
    if x is None:
        return "none"
    if isinstance(x, float) and math.isinf(x):
        return "unbounded"
    return f"{x:.{digits}g}"


def _pair(g: Guarantee) -> str:
    return f"({_num(g.epsilon)}, {_num(g.delta, 4)})"


def _para(text: str, indent: str = "") -> str:
    return textwrap.fill(text, width=_WIDTH, initial_indent=indent, subsequent_indent=indent or "",
                         break_on_hyphens=False)


def _item(text: str) -> str:
    return textwrap.fill(text, width=_WIDTH, initial_indent="  - ", subsequent_indent="    ",
                         break_on_hyphens=False)


def _adjacency_words(plan: Plan) -> str:
    unit = plan.unit
    who = "one impression" if unit.cap == 1 else f"one {unit.name} (all of its at most {unit.cap} examples)"
    if plan.adjacency.value == "replace-one":
        if plan.scenario.algorithm in ("rr", "walr"):
            return (f"two datasets that differ in the labels of {who} (label DP, replace-one adjacency); "
                    "features are treated as known to an adversary")
        if plan.scenario.algorithm == "hybrid":
            return (f"two datasets that differ in the sensitive features and/or labels of {who}, the "
                    "non-sensitive features held fixed (semi-sensitive DP, replace-one adjacency)")
        return f"two datasets in which the data of {who} is replaced (replace-one adjacency)"
    return f"two datasets that differ by the presence of {who} (add-remove adjacency)"


# phase class -> (plan, its 1-based place, the phase) -> the mechanism paragraph
Describe: TypeAlias = Callable[[Plan, int, Any], str]
_DESCRIBE: dict[type, Describe] = {}
D = TypeVar("D", bound=Describe)


def describes(phase_type: type) -> Callable[[D], D]:
    """Register the decorated ``words(plan, i, phase) -> str`` as the statement's paragraph for ``phase_type``.

    A plan with a phase kind that has none gets no statement (fail closed: a release the
    statement does not describe is not signed off).
    """
    def register(fn: D) -> D:
        _DESCRIBE[phase_type] = fn
        return fn
    return register


def _mechanism_lines(plan: Plan) -> list[str]:
    out = []
    if plan.tuned:
        out.append(_item("A grid of configurations is declared: the phases below are configuration 0's, each run on "
                         "the training part of the data; every configuration's phases are listed under "
                         "Composition, with the selection among them."))
    for i, p in enumerate(plan.phases, 1):
        words = _DESCRIBE.get(type(p))
        if words is None:
            raise UnsupportedError(f"no statement paragraph is registered for the phase kind {type(p).__name__} "
                                   f"({p.name!r})")
        out.append(_item(words(plan, i, p) + f" Planned to {_pair_target(p)}; accounted {_pair(p.guarantee)} by "
                                             f"{p.guarantee.method}."))
    return out


@describes(RRPhase)
def _rr_words(plan: Plan, i: int, p: RRPhase) -> str:
    rr = p.params
    text = (f"Phase {i}, randomized response on the binary label: each example's label is kept with "
            f"probability {_num(1 - rr.flip_probability)} and flipped with probability "
            f"{_num(rr.flip_probability)} (per-impression epsilon {_num(rr.per_impression_epsilon)}"
            f", rule {rr.per_impression_rule}), {rr.labels_randomised}. The model trained on them: "
            f"{rr.model}.")
    if rr.unit_part is not None:
        text += " " + _part_words(rr.unit_part, plan)
    if rr.per_impression_rule == "eps/K_i":
        text += (f" A unit with K_i <= {plan.unit.cap} examples uses epsilon "
                 f"{_num(rr.unit_epsilon)}/K_i per example.")
    if plan.free_calibration:
        text += (" After training, the model's intercept is shifted so that its mean prediction over "
                 "the training rows (a function of the released model and the non-sensitive "
                 "features, which this adjacency holds fixed) equals the debiased count of the "
                 "randomized labels: post-processing, at no cost.")
    return text


@describes(CountPhase)
def _count_words(plan: Plan, i: int, p: CountPhase) -> str:
    c = p.params
    return (f"Phase {i}, the dataset size: N = {c.dataset_size} is a differentially private count, "
            f"released {c.released}. The noise Z has P(Z = z) proportional to exp(-{_num(c.epsilon)} "
            f"|z| / {c.sensitivity}) (standard deviation {_num(c.noise_std)}); one "
            f"{_unit_words(plan)} adds or removes at most {c.sensitivity} "
            f"row{'s' if c.sensitivity > 1 else ''}. It was released before training, at planning "
            "time, so no run record has an entry for it; releasing it again would cost its epsilon "
            "again.")


@describes(CalibrationPhase)
def _calibration_words(plan: Plan, i: int, p: CalibrationPhase) -> str:
    cal = p.params
    target = ("that count" if cal.target == "positives" else
              "that count combined with the debiased count of the randomized labels")
    return (f"Phase {i}, the intercept calibration: one Gaussian release, after training, of "
            f"{cal.coordinates} numbers over the training rows: the sum of sigmoid(z_i + d) of the "
            f"trained model's logits z_i for each of the {cal.coordinates - 1} shifts d from "
            f"{_num(cal.shifts[0])} to {_num(cal.shifts[-1])}, and the count of positive labels. "
            f"Each row moves each number by at most 1, so the release moves by at most "
            f"{_num(cal.sensitivity)} per example; Gaussian noise of standard deviation "
            f"{_num(cal.noise_std)} is added once to each number. The shift of the model's intercept "
            f"that brings its mean prediction to {target} is post-processing and free.")


@describes(WALRPhase)
def _walr_words(plan: Plan, i: int, p: WALRPhase) -> str:
    walr = p.params
    rows = (f"({walr.features} features, intercept included)" if walr.encoding is None else
            "(every categorical column one-hot, every numeric column scaled into [0, 1], an intercept, each "
            "column weighted so that the weights' squares add up to the row bound's square)")
    text = (f"Phase {i}, one Gaussian release (WALR): the sum of y_i w_i x_i over all rows, each row "
            f"{rows} clipped to L2 norm "
            f"{_num(walr.row_norm_bound)} and each weight to {_num(walr.weights_bound)}, so one "
            f"label moves it by at most {_num(walr.sensitivity)}; Gaussian noise of standard "
            f"deviation {_num(walr.noise_std)} is added once. Gradient descent on the released "
            "vector is post-processing and free.")
    if not walr.classical_valid:
        text += (f" (The classical formula would give {_num(walr.classical_noise_std)}; it is not "
                 "valid at this epsilon and was not used.)")
    return text


@describes(DPSGDPhase)
def _dpsgd_words(plan: Plan, i: int, p: DPSGDPhase) -> str:
    """The mechanism item of DP-SGD phase ``i``: its steps, batches, clipping, noise and divisor."""
    sgd = p.params
    rows = (f"N = {sgd.dataset_size} rows" if plan.count is None else
            f"the data (N = {sgd.dataset_size} is the DP count; the true row count is never used)")
    if sgd.unit_part is not None:
        rows = f"the rows of its part of the units (N = {sgd.dataset_size} expected)"
    text = f"Phase {i}, DP-SGD: {sgd.steps} noisy steps ({_num(sgd.epochs)} epochs) over {rows}; "
    if sgd.sampling == "allocation":
        text += ("each epoch of T steps puts every example in exactly one uniformly random step (random "
                 f"allocation; batches of {sgd.batch_size} on average")
    elif sgd.sampling == "shuffle":
        text += (f"each epoch cuts a random permutation into batches of exactly {sgd.batch_size} (the "
                 "rows left over sit that epoch out")
    elif sgd.samples_units:
        text += (f"each step samples every one of the M = {sgd.units} {plan.unit.name} units "
                 f"independently with probability q = {_num(sgd.sampling_rate)} (expected "
                 f"{sgd.batch_size} units per batch")
    else:
        text += (f"each step samples every example independently with probability q = "
                 f"{_num(sgd.sampling_rate)} (expected batch {sgd.batch_size}")
    if sgd.max_batch_size:
        text += f", truncated to at most {sgd.max_batch_size} by a uniformly random subset"
    divisor = "the expected units per batch q M" if sgd.samples_units else "the expected batch size q N" \
        if sgd.sampling in ("poisson", "truncated-poisson") else f"the batch size {sgd.batch_size}"
    clipped = (f"), sums the gradients of each sampled unit's examples and clips that sum to L2 norm C = "
               f"{_num(sgd.clipping_norm)} once per unit" if sgd.samples_units else
               f"), clips each example's gradient to L2 norm C = {_num(sgd.clipping_norm)}")
    text += (f"{clipped} (scaled to "
             "C (1 - 64 machine epsilons) as computed, so floating-point rounding never takes a "
             "contribution past C), adds "
             f"Gaussian noise of standard deviation {_num(sgd.noise_std)} (noise multiplier "
             f"{_num(sgd.noise_multiplier)}) to the clipped sum once per step, and divides by "
             f"{divisor}.")
    if sgd.warm_start is not None:
        text += (f" It trains the full model warm-started from {sgd.warm_start}, the non-sensitive "
                 f"tower {sgd.nonsensitive_tower}.")
    if sgd.unit_part is not None:
        text += " " + _part_words(sgd.unit_part, plan)
    return text


def _part_words(part: UnitPart, plan: Plan) -> str:
    """Which units a phase on a part of a units split trains on."""
    unit = "impression" if plan.unit.cap == 1 else f"{plan.unit.name} unit"
    spec = plan.scenario.features
    place = ("the hash of the unit id keyed with" if spec is None or spec.unit_id is not None else
             "without a unit id column a public draw per row seeded from")
    return (f"It trains on the {unit}s whose position, {place} {part.key!r}, lies in "
            f"[{_num(part.low)}, {_num(part.high)}) of [0, 1): {_num(100 * (part.high - part.low))}% of them, about "
            f"{part.rows} rows; no other training phase reads their labels or sensitive features.")


def _unit_words(plan: Plan) -> str:
    return "impression" if plan.unit.cap == 1 else plan.unit.name


def _pair_target(p: Phase) -> str:
    return f"({_num(p.target_epsilon)}, {_num(p.target_delta, 4)})"


def _split_words(choice: SplitChoice) -> str:
    """What a table-driven split rule chose, and why."""
    return (f"The split rule {choice.rule} chose alpha = {_num(choice.alpha)} at the run's epsilon "
            f"{_num(choice.epsilon)} (randomized response eps1 = {_num(choice.epsilon1)}, DP-SGD eps2 = "
            f"{_num(choice.epsilon2)}): {choice.reason}.")


def _composition_lines(plan: Plan) -> list[str]:
    lines = []
    if plan.split is not None:
        lines.append(_item(_split_words(plan.split)))
    if plan.scenario.split_evidence is not None:
        lines.append(_item(f"The split {plan.scenario.split} was chosen on other data: {plan.scenario.split_evidence}. "
                           "Choosing it there costs the data this plan trains on no privacy, provided that data is "
                           "not the proxy's or part of it; if it is, the choice spent privacy this plan does not "
                           "account."))
    if len(unit_parts(plan.phases)) > 1:
        lines.append(_item(
            "The units are split, not the budget: each training phase reads the labels and sensitive features of "
            "its own part of the units only, and a unit's part depends on its id alone, which neighbouring "
            "datasets share. So one unit's data reaches one training phase (and the phases every unit takes "
            "part in), and the phases compose in parallel: by basic composition within each part (epsilons and "
            f"deltas add) and the largest over the parts, the run is {_pair(plan.total)}. Starting DP-SGD from "
            "the RR model is post-processing for the units DP-SGD trains on, which the RR model never saw."))
        lines += _pld_lines(plan, "each part's")
    elif len(plan.phases) > 1:
        lines.append(_item(
            f"The phases run one after another on the same data (later phases may use earlier outputs) and "
            f"compose: by basic composition (epsilons and deltas add) the run is {_pair(plan.total)}."))
        lines += _pld_lines(plan, "their")
    else:
        lines.append(_item(f"One phase: the run is {_pair(plan.total)}."))
    if plan.tuning is not None:
        t = plan.tuning
        g = t.guarantee
        if t.is_grid:
            lines += _grid_lines(plan, g)
            return lines
        if t.selection == "naive":
            text = (f"Hyperparameter tuning is declared: {t.configurations} configurations are trained, each "
                    f"within ({_num(plan.run_epsilon)}, {_num(plan.run_delta, 4)}), and the best is kept; their "
                    f"composition (naive, basic) is {_pair(g)}.")
            if t.pld_guarantee is not None:
                text += f" PLD composition of the runs gives {_pair(t.pld_guarantee)}."
        else:
            text = (f"Hyperparameter tuning is declared: the number of runs is drawn from a {t.distribution} "
                    f"distribution with mean {t.configurations} and only the best run's output is released; "
                    f"by repeat-and-select accounting (Papernot and Steinke 2022) this is {_pair(g)}.")
        lines.append(_item(text))
    return lines


def _pld_lines(plan: Plan, whose: str) -> list[str]:
    """The PLD total beside the basic one, or why there is none; under a PLD budget, the one planned to."""
    if plan.total_pld is not None and plan.pld_budget:
        return [_item(f"Composing {whose} privacy loss distributions under the shared adjacency gives "
                      f"{_pair(plan.total_pld)}: this is the run's guarantee, and the one planned to "
                      f"([accounting].composition = \"pld\", which the default \"auto\" chooses wherever the "
                      f"phases compose by PLD). So the phases could be planned to the larger basic "
                      f"budget of epsilon {_num(plan.run_epsilon)}, the largest whose composition stays within "
                      f"epsilon {_num(plan.epsilon)}, and each draws less noise than under a basic sum of "
                      f"{_num(plan.epsilon)}. The exact composition of the same mechanisms is the guarantee; the "
                      "basic sum only bounds it from above.")]
    if plan.total_pld is not None:
        s = plan.scenario
        why = ("[tuning] accounts whole runs by basic composition" if s.tuning is not None else
               "the DP count of N is composed by basic composition" if s.size_release_epsilon is not None else
               '[accounting].composition = "basic"')
        return [_item(f"Composing {whose} privacy loss distributions under the shared adjacency gives the tighter "
                      f"{_pair(plan.total_pld)} for the same run; the basic figure is the one planned to ({why}).")]
    return [_item(f"No PLD composition: {plan.total_pld_note}.")] if plan.total_pld_note else []


def _grid_lines(plan: Plan, g: Guarantee) -> list[str]:
    """A declared grid: what is varied, what each run and the selection cost, and their total."""
    t, tuning = plan.tuning, plan.scenario.tuning
    # a grid plan's scenario declares its grid, and its tuning lists the configurations and the selection
    assert t is not None and tuning is not None and t.grid is not None and t.noisy_max is not None
    sel = t.noisy_max
    varied = [f"{words} in {{{', '.join(v if isinstance(v, str) else _num(v) for v in values)}}}"
              for words, values in (("split", tuning.split), ("clipping norm", tuning.clipping_norm),
                                    ("DP-SGD learning rate", tuning.dpsgd_learning_rate)) if values is not None]
    out = [_item(
        f"Hyperparameter tuning over a declared grid of {t.configurations} configurations ({'; '.join(varied)}). "
        f"The units are divided once at random, independently of the data, into a training part and a validation "
        f"part ({_num(100 * sel.validation_fraction)}% of the units; never the evaluation data). Every "
        f"configuration is trained on the training part within the per-run budget ({_num(plan.run_epsilon)}, "
        f"{_num(plan.run_delta, 4)}), its phases as listed below.")]
    for entry in t.grid:
        phases = "; ".join(_grid_phase(p) for p in entry.phases)
        choice = entry.split_choice
        why = f" The rule chose alpha = {_num(choice.alpha)}: {choice.reason}." if choice else ""
        lr = entry.dpsgd_learning_rate
        out.append(_item(f"Configuration {entry.index}"
                         + (f", split {entry.split}" if entry.split else "")
                         + (f", DP-SGD learning rate {_num(lr)}" if lr is not None else "")
                         + f": {phases}; the run is {_pair(entry.total)}.{why}"))
    out.append(_item(
        f"Selection: each trained model is scored by {sel.score} (p = {_num(sel.prediction_clip)}), so one "
        f"{plan.unit.name} moves a score by at most {_num(sel.sensitivity)}; the best configuration is picked by "
        f"{sel.reference}, Gumbel noise of scale {_num(sel.gumbel_scale)}: ({_num(sel.epsilon)}, 0)-DP, "
        f"{_num(100 * sel.share)}% of the budget. Only the selected model is kept; the selection's noisy "
        "release (the index chosen) is in the run record."))
    out.append(_item(
        f"Total by basic composition of the {t.configurations} runs and the selection: {_pair(g)}. No parallel "
        "composition between the training and validation parts is claimed: under replace-one a replaced unit may "
        "move from one part to the other."))
    return out


def _grid_phase(p: Phase) -> str:
    if isinstance(p, RRPhase):
        return (f"randomized response at epsilon {_num(p.target_epsilon)} (flip probability "
                f"{_num(p.params.flip_probability)})")
    assert isinstance(p, DPSGDPhase)  # a grid's configurations train RR and DP-SGD phases
    return (f"DP-SGD at ({_num(p.target_epsilon)}, {_num(p.target_delta, 4)}), noise multiplier "
            f"{_num(p.params.noise_multiplier)}, clipping norm {_num(p.params.clipping_norm)}")


def _assumptions(plan: Plan) -> list[str]:
    out = []
    if plan.dpsgd is not None:
        trunc = plan.dpsgd.params.max_batch_size
        sampling = plan.dpsgd.params.sampling
        if sampling == "allocation":
            out.append(_item(
                "Random allocation: in every epoch each example is in exactly one step, chosen uniformly and "
                "independently by an unpredictable generator; Poisson, shuffled or fixed-size batches void it; the "
                "run resumes only at an epoch boundary."))
        elif sampling == "shuffle":
            out.append(_item(
                "Shuffled batches: each example is in at most one batch per epoch; no amplification is claimed, and "
                "the Poisson figure is NOT a guarantee here (Chua et al., arXiv:2403.17673, show shuffling cannot be "
                "accounted much below it)."))
        elif plan.dpsgd.params.samples_units:
            out.append(_item(
                f"Poisson sampling of units: every {plan.unit.name} joins each batch independently with probability q, "
                "at every step, with all of its (at most K) examples, and their summed gradient is clipped once. "
                "Sampling examples instead, or clipping examples one by one, would void this guarantee."))
        else:
            out.append(_item(
                "Poisson sampling: every example joins each batch independently with probability q, at every step"
                + (", and batches above the maximum are cut by a uniformly random subset" if trunc else "")
                + ". Shuffled or fixed-size batches are not Poisson samples and would void this guarantee."))
        out.append(_item("No more than the planned number of noisy steps is taken; an empty batch still counts as "
                         "a step and still gets its noise."))
    if plan.unit.cap > 1:
        n_is = ("a DP count of the rows after capping (the count phase)" if plan.count is not None else
                "the row count after capping")
        out.append(_item(f"Every {plan.unit.name} contributes at most {plan.unit.cap} examples after capping "
                         f"({plan.unit.capping} {plan.unit.cap} kept), and N = {plan.dataset_size} is {n_is}; "
                         "the data carries the unit ids capping needs."))
    if plan.count is not None:
        out.append(_item(f"N = {plan.dataset_size} is a DP estimate of the row count: the trainer samples every "
                         "row it has with q = B / N and divides by q N, both from the plan, whatever the true "
                         "count, so the model reveals only N; it does not refuse data of another size (that "
                         "refusal would itself reveal the true count)."))
    elif plan.unit.cap == 1:
        out.append(_item(f"The dataset has N = {plan.dataset_size} rows, as planned; a trainer refuses other "
                         "sizes."))
    if plan.rr is not None:
        out.append(_item("Labels are randomised once, with coin flips drawn directly from the operating system's "
                         "CSPRNG; training any number of epochs on them is post-processing. Drawing new noisy "
                         "labels would be a new release."))
        fraction = plan.rr.params.validation_fraction
        if fraction is not None:
            out.append(_item(f"The RR phase trains on all but {_num(100 * fraction)}% of the units, chosen by a "
                             "keyed hash of the unit id (never from labels), and scores itself on those held-out "
                             "units' randomised labels, debiased: it keeps its best state and stops when the score "
                             "stops improving. This costs no privacy: the labels it reads are the release, and the "
                             "model it scores reads only non-sensitive features. Nothing about a model that reads "
                             "sensitive features is chosen this way."))
    if plan.walr is not None:
        out.append(_item("The released sum is formed once, from rows clipped as stated; the bound on every row is "
                         "enforced by the trainer, not assumed of the data."))
        if plan.walr.params.encoding == "one-hot":
            out.append(_item("Under label DP every feature is public: the vocabularies of the categorical columns and "
                             "the range each numeric column is scaled by and each column's weight (from how many rows "
                             "share each value) are fitted on the training rows' features (never their labels), and "
                             "kept with the model. Only the labels are protected."))
    out.append(_item("All intermediate checkpoints and logged quantities computed from these outputs are covered: "
                     "the guarantee holds for everything released along the way, not only the final model."))
    return out


def _rr_training(ph: RRRun) -> str:
    """How the RR phase trained, in words: its epochs, or where its held-out units stopped it."""
    if ph.validation_rows is None or not ph.validation_checks:
        return f"{ph.epochs} epochs trained on them."
    done = _num(ph.validation_checks[-1], 3)
    if ph.validation_kept is None:
        return (f"{done} of at most {ph.epochs} epochs trained on them; no held-out score was finite, so the last "
                "state was kept.")
    kept, area = ph.validation_checks[ph.validation_kept], (ph.validation_auc or ())[ph.validation_kept]
    score = "held-out AUC" if ph.validation_by == "auc" else "held-out score"
    why = f"the {score} stopped improving" if ph.stopped == "patience" else "its epochs ran out"
    state = ("the moving average of the weights after" if ph.validation_averaged and
             ph.validation_averaged[ph.validation_kept] else "the state after")
    return (f"{done} of at most {ph.epochs} epochs trained on them, stopped because {why}; {state} "
            f"{_num(kept, 3)} epochs was kept (debiased held-out AUC "
            f"{'n/a' if area is None else _num(area, 4)} on {ph.validation_rows} held-out rows).{_rr_pairs(ph)}")


def _rr_pairs(ph: RRRun) -> str:
    """Which (learning rate, L2) pair the held-out units chose, where the phase trained several."""
    if ph.candidate_chosen is None or ph.candidate_lr is None or ph.candidate_weight_decay is None:
        return ""
    pairs = ", ".join(f"({_num(r, 3)}, {_num(d, 3)})" for r, d in zip(ph.candidate_lr, ph.candidate_weight_decay,
                                                                        strict=True))
    i = ph.candidate_chosen
    best = "highest debiased held-out AUC" if ph.validation_by == "auc" else "lowest debiased held-out loss"
    return (f" It trained once per (learning rate, L2) pair {pairs} from the same start and kept "
            f"({_num(ph.candidate_lr[i], 3)}, {_num(ph.candidate_weight_decay[i], 3)}), the {best}: a choice made "
            "on the release, so free.")


def _not_covered(plan: Plan) -> list[str]:
    out = []
    if plan.tuning is None:
        out.append(_item("Hyperparameter tuning: none is declared. Trying several configurations on this data and "
                         "keeping the best spends more privacy; declare it in [tuning] to have it accounted."))
    out.append(_item("Data-dependent preprocessing of protected data (vocabularies or frequency thresholds counted "
                     "on protected columns, normalisation by data statistics, the choice of the cap from the "
                     "data). The trainer refuses a vocabulary unless the adjacency holds the columns it is counted "
                     "on fixed (non-sensitive columns under label or semi-sensitive DP)."))
    if plan.count is not None:
        out.append(_item("Side channels: wall-clock times and memory grow with the true row count; the trainer "
                         "keeps them in the private record, with the batch sizes."))
    else:
        out.append(_item(f"The dataset size: N = {plan.dataset_size} is treated as public. The plan states it and "
                         "the trainer uses it (q = B / N, and the division by q N)"
                         + (", so under add-remove adjacency, where the presence of a unit is protected, the exact "
                            "N is revealed by the plan and not covered by the guarantee."
                            if plan.adjacency is Adjacency.ADD_REMOVE else
                            "; under replace-one adjacency N is the same for neighbouring datasets.")))
    out.append(_item("Anything released outside this plan from the same data, including evaluation metrics computed "
                     "on private labels, and other analyses of the same units: they compose with it."))
    return out


def _caveats(plan: Plan) -> list[str]:
    count = [] if plan.count is None else [
        _item("The DP count's noise is the difference of two geometric draws from numpy's sampler, seeded with 128 "
              "fresh bits of the operating system's CSPRNG: it inverts uniform doubles, so it realises the "
              "discrete Laplace pmf up to double rounding; the guarantee is for the exact pmf.")]
    return [
        _item("Floating point: noise is drawn and added in floating point; the guarantee is for the ideal "
              "real-valued mechanism (Mironov 2012 showed that naive floating-point Laplace sampling can leak)."),
        _item("Randomness: label flips come from the operating system's CSPRNG directly; Gaussian noise and "
              "Poisson samples come from torch generators seeded with 63 fresh bits of it per run, which are "
              "statistically sound but not cryptographic generators. A seeded, reproducible run is for "
              "debugging only: whoever knows the seed can remove the noise."),
        _item("The epsilons above are upper bounds: PLD accounting is pessimistic at its grid; closed forms are exact; "
              "calibrated values are rounded to the safe side."),
    ] + count


def _accountants(plan: Plan) -> list[str]:
    methods = sorted({p.guarantee.method for p in plan.phases})
    grids = sorted({p.guarantee.discretization for p in plan.phases if p.guarantee.discretization})
    v = plan.versions
    text = (f"Accounting: {', '.join(methods)}"
            + (f" (privacy loss distributions on a grid of {', '.join(_num(d) for d in grids)}, pessimistic: "
               "connect-the-dots rounding only ever increases epsilon)" if grids else "")
            + f". budgetplan {v.get('budgetplan')}, dp-accounting {v.get('dp-accounting')}, "
            f"prv-accountant {v.get('prv-accountant')}, numpy {v.get('numpy')}, scipy {v.get('scipy')}.")
    return [_item(text)]


def _artifacts(plan: Plan) -> list[str]:
    """What each file of a run reveals, and whether the guarantee covers it."""
    facts = []
    sized = plan.count is not None
    if plan.dpsgd is not None and sized:
        facts.append(", the noisy steps taken, the noise std and draws (the Poisson batch sizes, the chunks they "
                     "filled, timings and memory grow with the true row count: they are in private/)")
    elif plan.dpsgd is not None:
        facts.append(", the noisy steps taken and every step's Poisson batch size (drawn before any row is read), "
                     "the noise std and draws")
    if plan.rr is not None:
        facts.append(", the flip probability and the count of flipped labels (flips do not depend on the labels; "
                     "under eps/K_i they depend on unit sizes and the count stays private)")
    if plan.walr is not None:
        facts.append(", the release's noise std and dimension")
    out = [
        _item("plan.json and this statement: public; the parameters above, N, the feature columns and the "
              "guarantee. They are chosen before the data is read"
              + (", except N, the DP count (covered)." if sized else " (except N, see above).")),
        _item("model.pt, checkpoint.pt and everything computed from them: covered by the guarantee "
              "(post-processing of the mechanisms' outputs)."),
        _item("run.json, the public run record: what it holds is covered or independent of the data: the plan "
              "hash" + "".join(facts) + ", settings, code and library versions"
              + (" (its rows_used is the DP count N)" if sized else "") + ". It may travel with the model."),
        _item("ledger.jsonl, the write-ahead ledger: intents" + (", batch sizes" if plan.dpsgd and not sized else "")
              + " and release digests; public like run.json."),
        _item("private/: the data owner's record (data path and row counts, capping statistics, the keyed data "
              "fingerprint, the fraction of clipped examples, metrics on private labels"
              + (", the batch sizes with their own ledger private/ledger.jsonl, chunks, timings and memory"
                 if sized else "") + ") and the fingerprint "
              "key. These are statistics of the private data that the guarantee does NOT cover: they stay "
              "with the data owner."),
    ]
    if plan.rr is not None:
        out.append(_item("rr_labels.npy: the randomised labels themselves, the RR release (covered by its "
                         "guarantee), indexed by row: it stays with the data."))
    if plan.walr is not None:
        out.append(_item("walr_sum.npy: the one noisy release (covered)."))
    if plan.tuned:
        out.append(_item(
            "A tuned run: run.json lists every configuration's phases as above, the selected configuration (the "
            "selection's one release) and the training part's row count, which its randomized-response labels and "
            "batch sizes show anyway"
            + (f"; with up to {plan.unit.cap} examples per {plan.unit.name} that count depends on the units' sizes, "
               "a statistic of the data the guarantee does not cover" if plan.unit.cap > 1 else
               " (each row joins the validation part by an independent coin flip)")
            + ". The validation scores and the selection's noise are in private/; model.pt is the selected "
            "configuration's model, and c<i>_rr_labels.npy each configuration's randomised labels (covered)."))
    return out


def _columns(plan: Plan) -> list[str]:
    spec = plan.scenario.features
    if spec is None:
        return []
    public = list(spec.nonsensitive)
    if plan.scenario.algorithm == "dpsgd":
        return [_item(f"Columns: every column of an example is protected (label {spec.label!r}, features "
                      f"{', '.join(map(repr, spec.nonsensitive + spec.sensitive))}).")]
    protected = [spec.label] + list(spec.sensitive) if plan.scenario.algorithm == "hybrid" else [spec.label]
    known = public if plan.scenario.algorithm == "hybrid" else public + list(spec.sensitive)
    return [_item(f"Columns protected: {', '.join(map(repr, protected))}; treated as known to an adversary: "
                  f"{', '.join(map(repr, known)) or 'none'}.")]


def _attacker(plan: Plan, tradeoff: dict[str, Any]) -> list[str]:
    who = "one impression" if plan.unit.cap == 1 else f"one {plan.unit.name}"
    (a0, *rest), (t0, *more) = tradeoff["alphas"], tradeoff["tpr"]
    rates = (f"raises a false alarm for at most 1 in {round(1 / a0):,} (false-positive rate {_num(a0)}) is right "
             f"about at most {_num(100 * t0, 3)}% of the cases it looks for (true-positive rate)" + "".join(
                 f"; at a false-positive rate of {_num(a)}, at most {_num(100 * t, 3)}%" for a, t in zip(rest, more)))
    parted = len(unit_parts(plan.phases)) > 1
    source = ("the privacy loss distribution of each part's phases composed (delta at every epsilon), the "
              "larger true-positive rate of the parts at each false-positive rate" if parted and tradeoff["from"] ==
              "pld" else "the privacy loss distribution of the phases composed (delta at every epsilon)"
              if tradeoff["from"] == "pld" else
              f"the one ({_num(plan.guarantee.epsilon)}, {_num(plan.guarantee.delta, 4)}) guarantee (these phases "
              "have no joint privacy loss distribution here, so the bound is looser)")
    return [_item(f"Any test an attacker runs on what this plan releases, to tell which of two neighbouring values "
                  f"the data of {who} holds, that {rates}."),
            _item(f"Computed from {source}: TPR <= min over eps of e^eps FPR + delta(eps) (Kairouz, Oh and "
                  "Viswanath, arXiv:1311.0776; Dong, Roth and Su, arXiv:1905.02383). Guessing without the "
                  "release gives TPR = FPR.")]


def render_statement(plan: Plan, tradeoff: dict[str, Any] | None = None) -> str:
    """The privacy statement of ``plan`` as plain text.

    Args:
        tradeoff: ``budgetplan.accounting.tradeoff.plan_tradeoff(plan)``, when the caller has it already.
    """
    tradeoff = tradeoff or plan_tradeoff(plan)
    g = plan.guarantee
    head = plan.scenario.name
    lines = [f"PRIVACY STATEMENT - {head}", "=" * min(_WIDTH, len(head) + 20), ""]
    summary = (f"This training plan is ({_num(g.epsilon)}, {_num(g.delta, 4)})-differentially private for "
               f"{_adjacency_words(plan)}.")
    if plan.scenario.description:
        summary += f" Scenario: {plan.scenario.description}"
    lines += [_para(summary), ""]
    sections = [
        ("What is protected", [_item(f"Privacy unit: {plan.unit.describe()}."),
                               _item(f"Adjacency: {plan.adjacency.value}."),
                               _item(f"Budget: epsilon {_num(plan.epsilon)}, delta {_num(plan.delta, 4)}"
                                     + (f" ({plan.scenario.delta})" if isinstance(plan.scenario.delta, str) else "")
                                     + "."), *_columns(plan)]),
        ("Mechanisms", _mechanism_lines(plan)),
        ("Composition", _composition_lines(plan)),
        ("What the guarantee means to an attacker", _attacker(plan, tradeoff)),
        ("Accounting", _accountants(plan)),
        ("The guarantee assumes", _assumptions(plan)),
        ("Not covered", _not_covered(plan)),
        ("What each artifact of a run reveals", _artifacts(plan)),
        ("Caveats", _caveats(plan)),
    ]
    if plan.unit_alternatives:
        sections.append(("Ways to bound a unit, side by side (for comparison)", [
            _item(_alternative(a)) for a in plan.unit_alternatives]))
    if plan.warnings:
        sections.append(("Warnings", [_item(w) for w in plan.warnings]))
    for title, items in sections:
        lines += [title + ":", *items, ""]
    lines += [f"Plan sha256: {plan.sha256}", f"Plan schema version: {plan.schema_version}"]
    return "\n".join(lines) + "\n"


_KNOB_WORDS = {"per_impression_epsilon": "per-impression epsilon", "noise_multiplier": "noise multiplier",
               "noise_std": "noise std"}


def _alternative(a: UnitAlternative) -> str:
    if not a.applies:
        return f"{a.phase}, {a.bounding}: does not apply ({a.note})."
    knob = a.knob
    if knob is None:
        return f"{a.phase}, {a.bounding}."
    text = (f"{a.phase}, {a.bounding}: {_KNOB_WORDS[knob[0]]} {_num(knob[1])}, unit guarantee "
            f"({_num(a.unit_epsilon)}, {_num(a.unit_delta, 4)}); {a.note}.")
    if a.noise_per_contribution is not None:
        text += (f" {(a.execution or '').capitalize()}: about {_num(a.expected_contributions)} clipped "
                 f"contributions per step, noise {_num(a.noise_per_contribution)} x C per contribution"
                 + (f" Recommended: {a.recommendation}." if a.recommended else "."))
    return text


def render_run_statement(plan: Plan, record: RunRecord, tradeoff: dict[str, Any] | None = None) -> str:
    """The statement of what actually ran: the run's own facts, then the plan's statement.

    Raises:
        PlanMismatchError: the record is of a non-private run (no guarantee applies to it),
            or it names another plan than ``plan``: a statement is only ever printed for
            the plan the run executed.
    """
    _check_record_is_of_plan(plan, record)
    lines = [f"RUN STATEMENT - {plan.scenario.name}", "=" * min(_WIDTH, len(plan.scenario.name) + 16), ""]
    lines += ["What ran (public record):", *_public_run_items(plan, record), "", f"Run record sha256: {record.sha256}",
              ""]
    private = record.private_part
    if private is not None:
        lines += [_para("Held by the data owner (private record; statistics of the private data that the "
                        "guarantee does not cover, never to travel with the model):"), *_private_run_items(private), "",
                  f"Private record sha256: {private.sha256}", ""]
    lines.append(render_statement(plan, tradeoff))
    return "\n".join(lines)


def _check_record_is_of_plan(plan: Plan, record: RunRecord) -> None:
    """A run statement is printed only for a private run of this very plan."""
    if not record.private:
        raise PlanMismatchError("the record is of a non-private run: no privacy guarantee applies to it, so there is "
                                "no privacy statement to print")
    if record.plan_sha256 != plan.sha256:
        raise PlanMismatchError(f"the record names plan {record.plan_sha256}, not {plan.sha256}: its statement is "
                                "that plan's; pass the plan the run executed")


def _public_run_items(plan: Plan, record: RunRecord) -> list[str]:
    """The public record's items: plan and rows, randomness, each phase as run, tuning, code."""
    rows = (f"N = {record.rows_used} rows" if plan.count is None else
            f"the data planned with the DP count N = {record.rows_used} (its true row count is in the private record)")
    items = [_item(f"Executed plan {plan.sha256} on {rows}, on {record.device}.")]
    seeds = record.seeds
    items.append(_item("Randomness: privacy noise from generators seeded with fresh bits of the operating system's "
                       "CSPRNG (RR flips drawn from it directly)." if seeds.policy == "csprng" else
                       f"Randomness: SEEDED with {seeds.seed} for a reproducible debugging run: anyone who "
                       "knows the seed can remove the noise, so this run's outputs are not private."))
    items += [_item(text) for text in map(_entry_words, record.phases) if text is not None]
    if record.tuning is not None:
        sel = record.tuning.selection
        items.append(_item(f"Tuning: {len(record.tuning.runs)} of {record.tuning.configurations} "
                           f"declared configurations trained on the training part; report-noisy-max (epsilon "
                           f"{_num(sel.epsilon)}) selected configuration {sel.selected}, whose phases "
                           "are the ones above; the other configurations' phases are in the record."))
    items.append(_item(f"Code: budgetplan {record.code.budgetplan[:12]}..., trainers "
                       f"{record.code.trainers[:12]}... (sha256 of the sources)."))
    return items


# record entry class (public or private) -> entry -> its sentence in a run's statement
_ENTRY_WORDS: dict[type, Callable[[Any], str | None]] = {}
W = TypeVar("W", bound=Callable[[Any], "str | None"])


def describes_entry(entry_type: type) -> Callable[[W], W]:
    """Register the decorated ``words(entry) -> str | None`` as a run statement's sentence for ``entry_type``.

    Entries of a type with none (or whose words are None) add no sentence: the run's
    statement describes what each phase did where that is known, and the plan's paragraph
    (``describes``) is what the guarantee rests on.
    """
    def register(fn: W) -> W:
        _ENTRY_WORDS[entry_type] = fn
        return fn
    return register


def _entry_words(entry: PhaseRun | PhaseStats) -> str | None:
    words = _ENTRY_WORDS.get(type(entry))
    return None if words is None else words(entry)


@describes_entry(RRRun)
def _rr_run_words(ph: RRRun) -> str:
    flips = (f"flipped {ph.labels_flipped} of {ph.labels} labels once (flip probability "
             f"{_num(ph.flip_probability)})" if ph.labels_flipped is not None else
             f"randomised {ph.labels} labels once with each unit's own flip probability (eps/K_i; the "
             "count of flips depends on the unit sizes and stays in the private record)")
    return f"Randomized response {flips}; " + _rr_training(ph)


@describes_entry(WALRRun)
def _walr_run_words(ph: WALRRun) -> str:
    return f"WALR released its noisy aggregate once ({ph.noise_draws} noise draws of std {_num(ph.noise_std)})."


@describes_entry(CalibrationRun)
def _calibration_run_words(ph: CalibrationRun) -> str:
    return (f"The intercept calibration released its {ph.coordinates} noisy sums once "
            f"({ph.noise_draws} noise draws of std {_num(ph.noise_std)}) and shifted the "
            "model's intercept by what it solved from them.")


@describes_entry(DPSGDRun)
def _dpsgd_run_words(ph: DPSGDRun) -> str:
    """The DP-SGD phase as run: steps and sessions, realised batch sizes (unless withheld), noise."""
    text = (f"DP-SGD took {ph.steps_executed} of {ph.steps_planned} planned noisy steps"
            + (f" over {ph.sessions} sessions ({ph.steps_lost_to_interruptions} counted but lost to "
               "interruptions)" if ph.sessions > 1 else ""))
    if ph.withheld is not None:
        text += "; its batch sizes grow with the true row count and are in the private record"
    elif ph.batch_sizes_observed and ph.batch_size_sum is not None:
        text += (f"; realised batch sizes mean {_num(ph.batch_size_sum / ph.batch_sizes_observed)} "
                 f"(expected {_num(ph.batch_size_expected)}), min {ph.batch_size_min}, max "
                 f"{ph.batch_size_max} over {ph.batch_sizes_observed} steps")
    return text + f"; noise std {_num(ph.noise_std)} with {ph.noise_draws} draws in the last session."


def _private_run_items(private: PrivateRecord) -> list[str]:
    """The private record's items: the data read, capping, each phase's data-dependent statistics, audit, eval."""
    data = private.data
    held = [_item(f"Data: {data.rows_in} rows read from {data.path}, "
                  f"{data.rows_used} used; keyed fingerprint (HMAC-SHA256, key "
                  f"{data.fingerprint.key_id}) "
                  f"{data.fingerprint.hmac_sha256}.")]
    cap = data.capping
    if cap:
        held.append(_item(f"Capping kept {cap.get('rows_kept')} of {cap.get('rows_in')} rows "
                          f"({cap.get('rows_dropped')} dropped, {cap.get('units_capped')} units capped)."))
    held += [_item(text) for text in map(_entry_words, private.phases) if text is not None]
    one_run = private.one_run
    if one_run is not None:
        held.append(_item(_one_run_words(one_run)))
    ev = private.metrics.get("eval")
    if ev:
        held.append(_item(f"Evaluated on {ev.get('rows')} held-out rows: AUC {_num(ev['auc'])}, log loss "
                          f"{_num(ev['log_loss'])}."))
    return held


@describes_entry(RRStats)
def _rr_stats_words(st: RRStats) -> str | None:
    if st.labels_flipped is None:
        return None
    return (f"Randomized response flipped {st.labels_flipped} labels (mean flip probability "
            f"{_num(st.flip_probability_mean)}).")


@describes_entry(DPSGDStats)
def _dpsgd_stats_words(st: DPSGDStats) -> str:
    text = f"{_num(100 * st.clipped_fraction, 4)}% of sampled examples were clipped."
    w = st.withheld
    if w is not None and w.get("batch_sizes_observed"):
        text += (f" Realised batch sizes (withheld from the public record): mean "
                 f"{_num(w['batch_size_sum'] / w['batch_sizes_observed'])}, min {w['batch_size_min']}, "
                 f"max {w['batch_size_max']} over {w['batch_sizes_observed']} steps.")
    return text


@describes_entry(WALRStats)
def _walr_stats_words(st: WALRStats) -> str:
    return f"WALR clipped {st.rows_clipped} rows and {st.weights_clipped} weights to the declared bounds."


@describes_entry(CalibrationStats)
def _calibration_stats_words(st: CalibrationStats) -> str:
    return (f"The intercept calibration{'' if st.release else ' (free, from the RR labels)'} moved the "
            f"intercept by {_num(st.shift)}"
            + (" (the end of its grid: the target lay beyond it)" if st.clamped else "")
            + f": the {'noisy ' if st.release else ''}mean prediction {_num(st.mean_prediction_before)} "
            f"as trained, the target {_num(st.target_positives)} positives (variance "
            f"{_num(st.target_variance)}).")


def _one_run_words(one_run: Mapping[str, Any]) -> str:
    """The statement's line on a run trained with canaries (an f-DP record, or one written with Steinke's bound)."""
    head = (f"{one_run['canaries']} rows were replaced by canaries whose labels were secret coins; querying the model "
            f"guessed {one_run['correct']} of {one_run['guesses']} right")
    conf = _num(one_run["confidence"])
    if "method" not in one_run:
        return (f"One-run audit (arXiv:2305.08846): {head}, so epsilon >= {_num(one_run['epsilon_lower_bound'], 4)} "
                f"at confidence {conf} (the plan: {_num(one_run['planned_epsilon'])}).")
    verdict = ("refute the plan's trade-off curve: the model leaks more than the plan allows" if one_run["refutes_plan"]
               else "do not refute the plan's trade-off curve")
    return (f"One-run audit (arXiv:2410.22235): {head}. At confidence {conf} the guesses {verdict}; the most they "
            f"refute is the plan with its noise divided by {_num(one_run['noise_divisor'], 3)}, epsilon "
            f"{_num(one_run['epsilon_lower_bound'], 4)} (the plan: {_num(one_run['planned_epsilon'])}).")
