"""The noise each release drew is the plan's: DP-SGD noise, RR flips, the WALR and calibration releases."""

from __future__ import annotations

import hashlib
import math

import numpy as np
from scipy import stats

from budgetplan.audit.record import record_entry, settled_check
from budgetplan.audit.report import Check
from budgetplan.audit.sampling import (
    two_sided_binomial,
)
from budgetplan.plan import Plan
from budgetplan.plan.phases import CalibrationParams, WALRParams
from budgetplan.record.records import (
    CalibrationRun,
    CalibrationStats,
    DPSGDRun,
    RRRun,
    RRStats,
    RunRecord,
    WALRRun,
)


def noise_check(record: RunRecord, plan: Plan) -> Check:
    name = "DP-SGD noise"
    planned, ran = plan.dpsgd, record_entry(record, DPSGDRun)
    if (verdict := settled_check(name, planned, ran, "DP-SGD phase")) is not None:
        return verdict
    assert planned is not None and ran is not None  # settled otherwise
    par, problems = planned.params, []
    for label, have, want in (("noise std", ran.noise_std, par.noise_std),
                              ("noise multiplier", ran.noise_multiplier, par.noise_multiplier),
                              ("clipping norm", ran.clipping_norm, par.clipping_norm),
                              ("sampling rate", ran.sampling_rate, par.sampling_rate),
                              ("expected batch size", ran.batch_size_expected, par.expected_batch_size)):
        if not math.isclose(have, want, rel_tol=1e-12):
            problems.append(f"the run's {label} is {have!r}, the plan's {want!r}")
    if (ran.clipped_per == "unit") != par.samples_units:
        problems.append(f"the run clipped per {ran.clipped_per or 'example'}; the plan samples and clips per "
                        f"{'unit' if par.samples_units else 'example'}")
    if ran.truncated != (par.sampling == "truncated-poisson"):
        problems.append(f"the run {'truncated' if ran.truncated else 'did not truncate'} its batches; the plan "
                        f"samples {par.sampling!r}")
    want_draws = ran.steps_this_session * ran.trainable_parameters
    if ran.noise_draws != want_draws:
        problems.append(f"{ran.noise_draws} noise draws in this session; {ran.steps_this_session} steps of "
                        f"{ran.trainable_parameters} trainable parameters need {want_draws}")
    detail = "; ".join(problems) or (f"std {par.noise_std:.6g} = sigma {par.noise_multiplier:.6g} x C "
                                     f"{par.clipping_norm:g} on all {ran.trainable_parameters} trainable parameters "
                                     "at every step")
    return Check(name, not problems, detail)



def flips_check(record: RunRecord, plan: Plan, alpha: float) -> Check:
    name = "RR flips"
    planned, ran = plan.rr, record_entry(record, RRRun)
    if (verdict := settled_check(name, planned, ran, "RR phase")) is not None:
        return verdict
    assert planned is not None and ran is not None  # settled otherwise
    par = planned.params
    if par.unit_part is not None:  # a units split: RR's part and DP-SGD's hold every row between them
        sgd = record_entry(record, DPSGDRun)
        rest = sgd.part_rows if sgd is not None else None
        if rest is None or ran.labels + rest != plan.dataset_size:
            return Check(name, False, f"{ran.labels} labels randomised and {rest} rows in DP-SGD's part of the units; "
                                      f"the plan's N = {plan.dataset_size} must be their sum")
    elif ran.labels != plan.dataset_size:
        return Check(name, False, f"{ran.labels} labels randomised; the plan accounts N = {plan.dataset_size}")
    if ran.per_impression_rule != par.per_impression_rule:
        return Check(name, False, f"the run used the rule {ran.per_impression_rule!r}, the plan "
                                  f"{par.per_impression_rule!r}")
    if par.flip_probability_by_count is None:
        if ran.flip_probability is None or ran.labels_flipped is None:
            return Check(name, False, "the record shows no flip count for a uniform flip probability")
        rho = par.flip_probability
        if ran.flip_probability != rho:
            return Check(name, False, f"the run flipped with probability {ran.flip_probability!r}, the plan says "
                                      f"{rho!r}")
        p = two_sided_binomial(ran.labels_flipped, ran.labels, rho)
        detail = (f"{ran.labels_flipped} of {ran.labels} labels flipped, expected {ran.labels * rho:.1f}; two-sided "
                  f"binomial p = {p:.3g}")
        return Check(name, p >= alpha, detail + f" (fails below {alpha:g})")
    # eps/K_i: per-unit probabilities; the counts are in the data owner's private record.
    stats_ = next((s for s in record.private_part.phases if isinstance(s, RRStats)), None) \
        if record.private_part is not None else None
    if stats_ is None or stats_.labels_flipped is None or stats_.flip_probability_mean is None:
        return Check(name, False, "under eps/K_i the flips are in the private record, which is not here")
    rho_min, rho_max = min(par.flip_probability_by_count), max(par.flip_probability_by_count)
    if not rho_min <= stats_.flip_probability_mean <= rho_max:
        return Check(name, False, f"mean flip probability {stats_.flip_probability_mean!r} lies outside the plan's "
                                  f"[{rho_min!r}, {rho_max!r}]")
    n, flipped, rho = ran.labels, stats_.labels_flipped, stats_.flip_probability_mean
    z = (flipped - n * rho) / math.sqrt(max(n * rho * (1 - rho), 1e-12))  # Poisson-binomial: variance <= n rho (1-rho)
    p = float(2 * stats.norm.sf(abs(z)))
    return Check(name, p >= alpha, f"{flipped} of {n} labels flipped, expected {n * rho:.1f} (eps/K_i); two-sided "
                                   f"normal p = {p:.3g} (fails below {alpha:g})")



def gaussian_release_problems(ran: WALRRun | CalibrationRun, par: WALRParams | CalibrationParams) -> list[str]:
    """What every one-shot Gaussian release (WALR's, the calibration's) must match: one release at
    the plan's noise std and sensitivity."""
    problems = []
    if ran.releases != 1:
        problems.append(f"{ran.releases} releases; the plan accounts one")
    if ran.noise_std != par.noise_std:
        problems.append(f"noise std {ran.noise_std!r}, the plan's {par.noise_std!r}")
    if ran.sensitivity != par.sensitivity:
        problems.append(f"sensitivity {ran.sensitivity!r}, the plan's {par.sensitivity!r}")
    return problems



def walr_check(record: RunRecord, plan: Plan) -> Check:
    name = "WALR release"
    planned, ran = plan.walr, record_entry(record, WALRRun)
    if (verdict := settled_check(name, planned, ran, "WALR release")) is not None:
        return verdict
    assert planned is not None and ran is not None  # settled otherwise
    par, problems = planned.params, gaussian_release_problems(ran, planned.params)
    # one-hot rows: the dimension follows from the features' encoding, which the record's model states
    dimension = par.features if par.features is not None else record.model.config.get("features")
    if not isinstance(dimension, int) or isinstance(dimension, bool):
        problems.append(f"the record states no dimension of the released sum (model config features: {dimension!r})")
    elif ran.noise_draws != dimension:
        problems.append(f"{ran.noise_draws} noise draws for a {dimension}-dimensional sum")
    if ran.rows != plan.dataset_size:
        problems.append(f"{ran.rows} rows summed; the plan accounts N = {plan.dataset_size}")
    detail = "; ".join(problems) or (f"one release of a {dimension}-dimensional sum with noise std "
                                     f"{par.noise_std:.6g} (sensitivity {par.sensitivity:.6g})")
    return Check(name, not problems, detail)



def calibration_check(record: RunRecord, plan: Plan) -> Check:
    name = "intercept calibration"
    planned, ran = plan.calibration, record_entry(record, CalibrationRun)
    if (verdict := settled_check(name, planned, ran, "calibration release")) is not None:
        return verdict
    assert planned is not None and ran is not None  # settled otherwise
    par, problems = planned.params, gaussian_release_problems(ran, planned.params)
    if not ran.coordinates == ran.noise_draws == par.coordinates:
        problems.append(f"{ran.noise_draws} noise draws for {ran.coordinates} coordinates; the plan releases "
                        f"{par.coordinates}")
    if ran.rows != plan.dataset_size:
        problems.append(f"{ran.rows} rows summed; the plan accounts N = {plan.dataset_size}")
    stats_ = next((s for s in record.private_part.phases if isinstance(s, CalibrationStats)), None) \
        if record.private_part is not None else None
    if record.private_part is not None:
        if stats_ is None:
            problems.append("the private record holds no calibration statistics")
        elif hashlib.sha256(np.asarray(stats_.release, dtype=np.float64).tobytes()).hexdigest() != \
                ran.release_sha256:
            problems.append("the private record's released vector is not the one whose digest the run recorded")
        elif len(stats_.release) != par.coordinates:
            problems.append(f"the private record's release has {len(stats_.release)} coordinates, the plan "
                            f"{par.coordinates}")
    detail = "; ".join(problems) or (
        f"one release of {par.coordinates} coordinates with noise std {par.noise_std:.6g} (sensitivity "
        f"{par.sensitivity:.6g})" + (f"; intercept shifted by {stats_.shift:+.4g}" if stats_ is not None else ""))
    return Check(name, not problems, detail)
