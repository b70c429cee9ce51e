"""Forged run records: a finished Hybrid run's files edited as a forger who knows the formats would.

Records are edited and re-hashed, private records re-linked, ledgers re-chained. Each
forgery is ``(id, forge(run directory), the audit check that must fail)``; ``forge`` edits
a copy of an honest, completed Hybrid run (an RR phase then at least 12 Poisson DP-SGD steps,
its private record, ledger and vocabulary beside it) in place, whatever its N. Used by
``tests/test_audit.py`` (each forgery fails its named check) and by the fuzz corpus
(``tests/fuzz/corpus_forged.py``: each fails ``budgetplan audit``).
"""

import json
import shutil

import numpy as np

from budgetplan.record.ledger import digest, line
from budgetplan.record.records import PrivateRecord, RunRecord, load_record

__all__ = ["FORGERIES", "copy_run", "write_record", "write_raw_record", "rechain", "rehash", "public", "dpsgd", "rr",
           "forge_too_many_steps", "forge_seeds_note", "forge_non_private", "forge_plan_edited"]

# ------------------------------------------------------------------------- forging tools


def copy_run(root, name):
    out = root / "forged" / name
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(root / "run", out)
    return out


def write_record(out, content: dict, private: PrivateRecord | None = None):
    """Re-hash a public record's content (and re-link an edited private record)."""
    if private is not None:
        (out / "private" / "record.json").write_text(private.to_json())
        content = {**content, "private_sha256": private.sha256}
    body = {k: v for k, v in content.items()}
    (out / "run.json").write_text(RunRecord.from_json(rehash(body)).to_json())


def rehash(body: dict) -> str:
    import hashlib

    from budgetplan.plan import canonical_json

    sha = hashlib.sha256(canonical_json(body).encode("ascii")).hexdigest()
    return json.dumps({**body, "sha256": sha}, sort_keys=True, indent=2)


def write_raw_record(out, content: dict):
    """A record that no longer loads as the schema says, re-hashed all the same."""
    (out / "run.json").write_text(rehash(content))


def rechain(out, edit_entries):
    """Rewrite the ledger with edited entries and a valid hash chain; the record follows its new head."""
    path = out / "ledger.jsonl"
    entries = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    entries = edit_entries(entries)
    prev, lines = "0" * 64, []
    for i, e in enumerate(entries):
        e = {k: v for k, v in e.items() if k not in ("hash", "prev", "seq")}
        e = {"seq": i, "prev": prev, **e}
        e["hash"] = prev = digest(e)
        lines.append(line(e))
    path.write_text("\n".join(lines) + "\n")
    content = load_record(out).content()
    content["ledger"] = {"head": prev, "lines": len(entries)}
    return content


def dpsgd(content):
    return next(p for p in content["phases"] if p["name"] == "dpsgd")


def rr(content):
    return next(p for p in content["phases"] if p["name"] == "rr")


def public(out):
    return load_record(out).content()


# Each forgery: (id, function(run directory) -> None, editing it in place, the check that must fail).
def forge_field_removed(out):
    c = public(out)
    del dpsgd(c)["steps_this_session"]
    write_raw_record(out, c)


def forge_rr_entry_removed(out):
    c = public(out)
    c["phases"] = [p for p in c["phases"] if p["name"] != "rr"]
    write_record(out, c)


def forge_unknown_field(out):
    c = public(out)
    rr(c)["comment"] = "ok"
    write_raw_record(out, c)


def forge_too_many_steps(out):
    c = public(out)
    dpsgd(c)["steps_executed"] = dpsgd(c)["steps_planned"] + 1
    write_record(out, c)


def forge_other_plan(out):
    c = public(out)
    c["plan_sha256"] = "0" * 64
    write_record(out, c)


def forge_non_private(out):
    c = public(out)
    c["plan_sha256"], c["private"] = None, False
    write_record(out, c)


def forge_rows(out):
    c = public(out)
    c["rows_used"] -= 1
    write_record(out, c)


def forge_flip_probability(out):
    c = public(out)
    rr(c)["flip_probability"] *= 1.000001
    write_record(out, c)


def forge_flips_halved(out):
    c = public(out)
    rr(c)["labels_flipped"] //= 2
    write_record(out, c)


def forge_labels(out):
    c = public(out)
    rr(c)["labels"] //= 2
    write_record(out, c)


def forge_noise_std(out):
    c = public(out)
    dpsgd(c)["noise_std"] /= 2
    write_record(out, c)


def forge_noise_draws(out):
    c = public(out)
    dpsgd(c)["noise_draws"] //= 3
    write_record(out, c)


def _forged_evidence(out, edit):
    """The private record's DP-SGD evidence edited, the private record re-hashed and re-linked, as a forger
    who knows the format would."""
    import dataclasses

    from budgetplan.util.typed import to_json

    record = load_record(out)
    phases = tuple(dataclasses.replace(p, evidence=edit(to_json(p.evidence)))
                   if getattr(p, "evidence", None) is not None else p for p in record.private_part.phases)
    write_record(out, public(out), dataclasses.replace(record.private_part, phases=phases))


def forge_noise_not_drawn(out):
    def edit(ev):  # step 7's draw claimed by no rank, with nothing drawn
        ev["noise_ranks"][7], ev["noise_draws"][7], ev["noise_chi2"][7] = [], 0, 0.0
        return ev
    _forged_evidence(out, edit)


def forge_noise_draw_empty(out):
    def edit(ev):  # rank 0 claims step 7's draws, but their sum of squares is that of no noise
        ev["noise_chi2"][7] = 0.0
        return ev
    _forged_evidence(out, edit)


def forge_batch_stats(out):
    c = public(out)
    ph = dpsgd(c)
    b, t = round(ph["batch_size_expected"]), ph["batch_sizes_observed"]  # every batch exactly its expected size
    ph["batch_size_sum"], ph["batch_size_sumsq"] = b * t, b * b * t
    write_record(out, c)


def forge_fixed_size_ledger(out):
    b = round(dpsgd(public(out))["batch_size_expected"])

    def edit(entries):
        for e in entries:
            if e.get("event") == "intent" and e.get("phase") == "dpsgd":
                e["batch_size"] = b  # every batch exactly the expected size: shuffled, not Poisson
        return entries
    c = rechain(out, edit)
    ph = dpsgd(c)
    t = ph["batch_sizes_observed"]
    ph.update(batch_size_sum=b * t, batch_size_sumsq=b * b * t, batch_size_min=b, batch_size_max=b)
    write_record(out, c)


def forge_ledger_deleted(out):
    (out / "ledger.jsonl").unlink()


def forge_ledger_line_edited(out):
    path = out / "ledger.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    k = next(i for i, x in enumerate(lines) if '"phase":"dpsgd"' in x)
    e = json.loads(lines[k])
    e["batch_size"] += 1
    lines[k] = line(e) + "\n"
    path.write_text("".join(lines))


def forge_ledger_cut(out):
    path = out / "ledger.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:-5]))


def forge_ledger_cut_record_follows(out):
    kept = dpsgd(public(out))["steps_executed"] * 5 // 6  # the last sixth of the steps cut

    def edit(entries):
        keep = [e for e in entries if not (e.get("event") == "intent" and e.get("step", 0) >= kept
                                           and e.get("phase") == "dpsgd")]
        return keep
    c = rechain(out, edit)
    ph = dpsgd(c)
    sizes = [json.loads(x)["batch_size"] for x in (out / "ledger.jsonl").read_text().splitlines()
             if '"phase":"dpsgd"' in x and '"intent"' in x]
    ph.update(steps_executed=kept, batch_sizes_observed=kept, batch_size_sum=sum(sizes),
              batch_size_sumsq=sum(s * s for s in sizes), batch_size_min=min(sizes), batch_size_max=max(sizes))
    write_record(out, c)


def forge_second_release(out):
    def edit(entries):
        rel = next(e for e in entries if e.get("event") == "released")
        i = entries.index(rel)
        return entries[:i + 1] + [{"event": "intent", "phase": "rr", "step": 0}, dict(rel)] + entries[i + 1:]
    write_record(out, rechain(out, edit))


def forge_labels_file(out):
    labels = np.load(out / "rr_labels.npy")
    labels[:10] = 1 - labels[:10]
    np.save(out / "rr_labels.npy", labels)


def forge_release_digest(out):
    c = public(out)
    rr(c)["release_sha256"] = "f" * 64
    write_record(out, c)


def forge_extra_session(out):
    def edit(entries):
        i = next(k for k, e in enumerate(entries) if e.get("event") == "intent" and e.get("phase") == "dpsgd")
        return entries[:i] + [{"event": "resume"}] + entries[i:]
    write_record(out, rechain(out, edit))


def forge_private_edited(out):
    priv = PrivateRecord.from_json((out / "private" / "record.json").read_text())
    content = priv.content()
    content["phases"][1]["clipped_fraction"] = 0.0
    (out / "private" / "record.json").write_text(rehash(content))


def forge_plan_edited(out):
    """Half the noise, the guarantee left as it was, re-hashed in canonical form so that it loads."""
    import hashlib

    from budgetplan.plan import canonical_json

    plan = json.loads((out / "plan.json").read_text())
    for where in ("parameters", "mechanism"):
        plan["phases"][1][where]["noise_multiplier"] *= 0.5
    plan["phases"][1]["parameters"]["noise_std"] *= 0.5
    body = {k: v for k, v in plan.items() if k != "sha256"}
    body["sha256"] = hashlib.sha256(canonical_json(body).encode("ascii")).hexdigest()
    (out / "plan.json").write_text(json.dumps(body, sort_keys=True, indent=2, ensure_ascii=True) + "\n")


def _private(out) -> dict:
    return PrivateRecord.from_json((out / "private" / "record.json").read_text()).content()


def _write_private(out, private_content: dict):
    """Re-hash an edited private record and re-link the public record to it, as a forger who knows the format."""
    write_record(out, public(out), PrivateRecord.from_json(rehash(private_content)))


def forge_seeds_policy(out):
    """The run drew from the CSPRNG; the record now says it was seeded (re-hashed)."""
    c = public(out)
    c["seeds"] = {"policy": "seeded", "seed": 7, "note": "reproducible run"}
    write_record(out, c)


def forge_seeds_note(out):
    """The ledger's seed note edited and re-chained: the record and ledger say seeded, the run was not."""
    def edit(entries):
        for e in entries:
            if e.get("event") == "seeds":
                e.update(policy="seeded", seed=7)
        return entries
    c = rechain(out, edit)
    c["seeds"] = {"policy": "seeded", "seed": 7, "note": "reproducible run"}
    write_record(out, c)


def forge_replayed_streams(out):
    """A second session whose ledger says it drew from the first session's streams (a replay)."""
    half = dpsgd(public(out))["steps_executed"] // 2

    def edit(entries):
        i = next(k for k, e in enumerate(entries) if e.get("event") == "intent" and e.get("phase") == "dpsgd")
        note = dict(next(e for e in entries if e.get("event") == "seeds"))
        return entries[:i + half] + [{"event": "resume"}, note] + entries[i + half:]
    c = rechain(out, edit)
    dpsgd(c)["sessions"] = 2
    write_record(out, c)


def forge_no_seed_note(out):
    write_record(out, rechain(out, lambda entries: [e for e in entries if e.get("event") != "seeds"]))


def forge_private_rows(out):
    """rows_in and rows_used set below the plan's N in the private record (re-hashed, re-linked)."""
    content = _private(out)
    content["data"]["rows_in"] = content["data"]["rows_used"] = content["data"]["rows_used"] * 3 // 4
    _write_private(out, content)


def forge_private_rows_in(out):
    content = _private(out)
    content["data"]["rows_in"] = content["data"]["rows_used"] * 3 // 4  # fewer rows read than used: no capping
    _write_private(out, content)


def forge_private_plan(out):
    content = _private(out)
    content["plan_sha256"] = "0" * 64
    _write_private(out, content)


def forge_model_deleted(out):
    (out / "model.pt").unlink()


def forge_model_replaced(out):
    import torch

    state = torch.load(out / "model.pt", weights_only=False)
    key = next(iter(state))
    state[key] = state[key] * 0  # another model in its place
    torch.save(state, out / "model.pt")


def forge_model_digest_removed(out):
    c = public(out)
    del c["model"]["sha256"]
    write_record(out, c)


def forge_vocabulary_edited(out):
    vocab = json.loads((out / "vocabulary.json").read_text())
    column = next(iter(vocab))
    vocab[column] = [f"not-{v}" for v in vocab[column]] if isinstance(vocab[column], list) else {
        f"not-{k}": v for k, v in vocab[column].items()}  # the model's rows now stand for other values
    (out / "vocabulary.json").write_text(json.dumps(vocab, sort_keys=True) + "\n")


def forge_vocabulary_deleted(out):
    (out / "vocabulary.json").unlink()


def forge_vocabulary_digest_removed(out):
    c = public(out)
    del c["model"]["vocabulary_sha256"]
    write_record(out, c)


def forge_vocabulary_and_digest_removed(out):
    forge_vocabulary_digest_removed(out)
    (out / "vocabulary.json").unlink()


def forge_labels_deleted(out):
    (out / "rr_labels.npy").unlink()


def forge_code(out):
    c = public(out)
    c["code"]["trainers"] = "0" * 64
    write_record(out, c)


FORGERIES = [
    ("dpsgd field removed", forge_field_removed, "record is well-formed"),
    ("unknown field", forge_unknown_field, "record is well-formed"),
    ("private record edited", forge_private_edited, "record is well-formed"),
    ("rr entry removed", forge_rr_entry_removed, "record names the plan"),
    ("rr entry removed: no flips to test", forge_rr_entry_removed, "RR flips"),
    ("other plan", forge_other_plan, "record names the plan"),
    ("non-private", forge_non_private, "record names the plan"),
    ("rows", forge_rows, "record names the plan"),
    ("plan edited", forge_plan_edited, "plan verifies"),
    ("too many steps", forge_too_many_steps, "steps within plan"),
    ("extra session", forge_extra_session, "steps within plan"),
    ("ledger cut, record follows", forge_ledger_cut_record_follows, "steps within plan"),
    ("ledger deleted", forge_ledger_deleted, "ledger"),
    ("ledger line edited", forge_ledger_line_edited, "ledger"),
    ("ledger cut", forge_ledger_cut, "ledger"),
    ("second release", forge_second_release, "ledger"),
    ("labels file", forge_labels_file, "ledger"),
    ("release digest", forge_release_digest, "ledger"),
    ("noise std", forge_noise_std, "DP-SGD noise"),
    ("noise draws", forge_noise_draws, "DP-SGD noise"),
    ("noise not drawn", forge_noise_not_drawn, "DP-SGD noise evidence"),
    ("noise draw empty", forge_noise_draw_empty, "DP-SGD noise evidence"),
    ("batch statistics", forge_batch_stats, "Poisson batch sizes"),
    ("fixed-size batches", forge_fixed_size_ledger, "Poisson batch sizes: spread"),
    ("flip probability", forge_flip_probability, "RR flips"),
    ("flips halved", forge_flips_halved, "RR flips"),
    ("labels", forge_labels, "RR flips"),
    ("code", forge_code, "code that ran"),
    ("seeds csprng to seeded", forge_seeds_policy, "seed policy"),
    ("replayed streams", forge_replayed_streams, "seed policy"),
    ("no seed note", forge_no_seed_note, "seed policy"),
    ("private rows below N", forge_private_rows, "record names the plan"),
    ("private rows_in below rows_used", forge_private_rows_in, "record names the plan"),
    ("private plan replaced", forge_private_plan, "record names the plan"),
    ("model deleted", forge_model_deleted, "model file"),
    ("model replaced", forge_model_replaced, "model file"),
    ("model digest removed", forge_model_digest_removed, "model file"),
    ("rr labels deleted", forge_labels_deleted, "ledger"),
    ("vocabulary edited", forge_vocabulary_edited, "vocabulary file"),
    ("vocabulary deleted", forge_vocabulary_deleted, "vocabulary file"),
    ("vocabulary digest removed", forge_vocabulary_digest_removed, "vocabulary file"),
    ("vocabulary and digest removed", forge_vocabulary_and_digest_removed, "vocabulary file"),
]
