"""Plan files, run records and data files, broken in every way we could think of.

Plans are fed to every command that reads one (show, verify, statement, train, audit
--plan); run records to audit, statement, plot frontier and train --baseline; data files
to data count, train --data and --eval, and audit --data.
"""

from __future__ import annotations

import json

from tests.fuzz.artefacts import TRAIN_ROWS
from tests.fuzz.harness import Artefact, Bytes, Case, Dir, Text

__all__ = ["file_cases"]


def _replace_first(old: bytes, new: bytes):
    def edit(data: bytes) -> bytes:
        if old not in data:
            raise ValueError(f"{old!r} is not in the artefact")
        return data.replace(old, new, 1)
    return edit


def _json_edit(fn):
    """Edit the parsed JSON, then write it back in the canonical layout (so only the content differs)."""
    def edit(data: bytes) -> bytes:
        obj = json.loads(data)
        fn(obj)
        return (json.dumps(obj, sort_keys=True, indent=2, ensure_ascii=True) + "\n").encode()
    return edit


def _set_path(*path_and_value):
    *path, value = path_and_value

    def fn(obj):
        for key in path[:-1]:
            obj = obj[key]
        obj[path[-1]] = value
    return fn


def _drop_key(key):
    return lambda obj: obj.pop(key)


DEEP = b"[" * 100_000 + b"]" * 100_000

# Broken bytes for any JSON input: (name, edit of the valid file's bytes).
BROKEN_JSON = (
    ("empty", lambda b: b""),
    ("whitespace", lambda b: b"  \n"),
    ("binary", lambda b: bytes(range(256)) * 4),
    ("nul-bytes", lambda b: b"\x00" * 64),
    ("invalid-utf8", lambda b: b[:40] + b"\xff\xfe" + b[40:]),
    ("utf8-bom", lambda b: b"\xef\xbb\xbf" + b),
    ("utf16", lambda b: b.decode().encode("utf-16")),
    ("truncated-half", lambda b: b[: len(b) // 2]),
    ("truncated-last-byte", lambda b: b[:-1]),
    ("truncated-closing-brace", lambda b: b.rstrip()[:-1]),
    ("trailing-garbage", lambda b: b + b"garbage"),
    ("two-objects", lambda b: b + b),
    ("crlf", lambda b: b.replace(b"\n", b"\r\n")),
    ("cr-only", lambda b: b.replace(b"\n", b"\r")),
    ("no-final-newline", lambda b: b.rstrip(b"\n")),
    ("extra-final-newline", lambda b: b + b"\n"),
    ("tab-indent", lambda b: b.replace(b"  ", b"\t")),
    ("compact", lambda b: json.dumps(json.loads(b), sort_keys=True).encode()),
    ("array", lambda b: b"[1, 2, 3]\n"),
    ("string", lambda b: b'"plan"\n'),
    ("number", lambda b: b"42\n"),
    ("null", lambda b: b"null\n"),
    ("true", lambda b: b"true\n"),
    ("empty-object", lambda b: b"{}\n"),
    ("array-of-it", lambda b: b"[" + b + b"]"),
    ("deep-nesting", lambda b: DEEP),
    ("nan-literal", lambda b: b.replace(b': 1e-06', b': NaN', 1) if b': 1e-06' in b else b[:-2] + b', "x": NaN}\n'),
    ("infinity-literal", lambda b: b[:-2] + b',\n  "zz": Infinity\n}\n'),
    ("huge-number", lambda b: b[:-2] + b',\n  "zz": 1e999\n}\n'),
    ("huge-integer", lambda b: b[:-2] + b',\n  "zz": ' + b"9" * 5000 + b"\n}\n"),
    ("duplicate-key", lambda b: b[:-2] + b',\n  "sha256": "0"\n}\n'),
    ("non-ascii-escape-raw", lambda b: b.replace(b'"sha256": "', "\"sha256\": \"\u00e9".encode(), 1)),
)

# Content edits of a valid plan that keep it well-formed JSON.
PLAN_EDITS = (
    ("flipped-digit", _replace_first(b'"schema_version": 1', b'"schema_version": 2')),
    ("edited-epsilon", _json_edit(_set_path("budget", "epsilon", 3.0))),
    ("space-added", _replace_first(b'{\n  "', b'{\n   "')),
    ("sha-wrong", _json_edit(_set_path("sha256", "0" * 64))),
    ("sha-missing", _json_edit(_drop_key("sha256"))),
    ("sha-number", _json_edit(_set_path("sha256", 5))),
    ("schema-missing", _json_edit(_drop_key("schema_version"))),
    ("schema-string", _json_edit(_set_path("schema_version", "1"))),
    ("schema-float", _json_edit(_set_path("schema_version", 1.0))),
    ("phases-missing", _json_edit(_drop_key("phases"))),
    ("phases-not-list", _json_edit(_set_path("phases", {"rr": 1}))),
    ("phases-empty", _json_edit(_set_path("phases", []))),
    ("scenario-not-object", _json_edit(_set_path("scenario", "rr"))),
    ("budget-negative", _json_edit(_set_path("budget", "epsilon", -1.0))),
    ("privacy-unit-garbage", _json_edit(_set_path("privacy", "unit", [1, 2]))),
    ("extra-key", _json_edit(_set_path("zz", 1))),
)


def _plan_cases() -> list[Case]:
    cases = []
    readers = (
        ("show", ("show", "plan.json")),
        ("verify", ("verify", "plan.json")),
        ("statement", ("statement", "plan.json")),
        ("verify-json", ("verify", "plan.json", "--json")),
    )
    for name, edit in BROKEN_JSON + PLAN_EDITS:
        for reader, argv in readers:
            if reader == "verify-json" and (name, edit) not in PLAN_EDITS[:3] + BROKEN_JSON[:3]:
                continue
            cases.append(Case(id=f"plan-{name}-{reader}", argv=argv, expect="reject",
                              inputs=(Artefact("plan.json", "plan-rr-impression", edit),)))
    train = ("train", "plan.json", "--data", "train.parquet", "--out", "run")
    for name, edit in BROKEN_JSON[:14] + PLAN_EDITS[:6]:
        cases.append(Case(id=f"plan-{name}-train", argv=train, expect="reject",
                          inputs=(Artefact("plan.json", "plan-train", edit),
                                  Artefact("train.parquet", "train-parquet"))))
    plan = Artefact("plan.json", "plan-rr-impression")
    cases += [
        Case("plan-valid-show", ("show", "plan.json", "--json"), "accept", inputs=(plan,)),
        Case("plan-valid-verify", ("verify", "plan.json", "--json"), "accept", inputs=(plan,)),
        Case("plan-valid-statement", ("statement", "plan.json"), "accept", inputs=(plan,)),
        Case("plan-missing-show", ("show", "nope.json"), "reject"),
        Case("plan-missing-verify", ("verify", "nope.json"), "reject"),
        Case("plan-missing-statement", ("statement", "nope.json"), "reject"),
        Case("plan-directory-show", ("show", "d"), "reject", inputs=(Dir("d"),)),
        Case("plan-directory-verify", ("verify", "d"), "reject", inputs=(Dir("d"),)),
        Case("plan-empty-path-show", ("show", ""), "reject"),
        Case("plan-empty-path-statement", ("statement", ""), "reject"),
        Case("plan-in-closed-dir-show", ("show", "d/plan.json"), "reject",
             inputs=(Artefact("d/plan.json", "plan-rr-impression"), Dir("d", 0)), root_ok=False),
        Case("plan-in-closed-dir-verify", ("verify", "d/plan.json"), "reject",
             inputs=(Artefact("d/plan.json", "plan-rr-impression"), Dir("d", 0)), root_ok=False),
        Case("plan-is-scenario", ("show", "s.json"), "reject",
             inputs=(Text("s.json", '{"budget": {"epsilon": 1}}'),)),
        Case("plan-dpsgd-verify", ("verify", "plan.json"), "accept",
             inputs=(Artefact("plan.json", "plan-small-dpsgd"),)),
        Case("plan-walr-statement", ("statement", "plan.json"), "accept", inputs=(Artefact("plan.json", "plan-walr"),)),
        Case("plan-dpsgd-export", ("export", "plan.json", "--json"), "accept",
             inputs=(Artefact("plan.json", "plan-small-dpsgd"),)),
        Case("plan-rr-export", ("export", "plan.json"), "reject", inputs=(plan,)),  # no DP-SGD phase
        Case("plan-missing-export", ("export", "nope.json"), "reject"),
        Case("plan-directory-export", ("export", "d"), "reject", inputs=(Dir("d"),)),
        Case("plan-export-to-nothing", ("export", "plan.json", "--to", "tf-privacy"), "reject",
             inputs=(Artefact("plan.json", "plan-small-dpsgd"),)),
    ]
    for name, edit in BROKEN_JSON[:6] + PLAN_EDITS[:3]:
        cases.append(Case(id=f"plan-{name}-export", argv=("export", "plan.json"), expect="reject",
                          inputs=(Artefact("plan.json", "plan-small-dpsgd", edit),)))
    return cases


def _rehashed(path: tuple, value):
    """Set the field at ``path`` and recompute the sha256: an edit the hash alone cannot catch."""
    def edit(data: bytes) -> bytes:
        import hashlib

        from budgetplan.plan import canonical_json

        obj = json.loads(data)
        target = obj
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
        obj.pop("sha256")
        obj["sha256"] = hashlib.sha256(canonical_json(obj).encode("ascii")).hexdigest()
        return (json.dumps(obj, sort_keys=True, indent=2, ensure_ascii=True) + "\n").encode()
    return edit


def _field_paths(obj, path=()):
    """Every field of a plan (the first two items of each list), the hash excluded."""
    if path:
        yield path
    if isinstance(obj, dict):
        for key, value in obj.items():
            if key != "sha256":
                yield from _field_paths(value, path + (key,))
    elif isinstance(obj, list):
        for i, value in enumerate(obj[:2]):
            yield from _field_paths(value, path + (i,))


def _rehashed_cases() -> list[Case]:
    """Every field of a Hybrid and a WALR plan given a value of the wrong type, hash recomputed.

    Each field is read by one of show, statement and verify in turn: all three must refuse
    the plan naming the field (they share the loader), never half-read it.
    """
    from budgetplan.planning.planner import build_plan
    from budgetplan.scenario.model import parse_scenario
    from tests.fuzz.artefacts import SMALL_SCENARIOS

    readers = ("show", "statement", "verify")
    cases = []
    for artefact, algorithm, keep in (("plan-small-hybrid", "hybrid", lambda p: True),
                                      ("plan-walr", "walr",
                                       lambda p: p[0] == "phases" or p[:2] == ("scenario", "walr"))):
        content = build_plan(parse_scenario(SMALL_SCENARIOS[algorithm])).content()
        for i, path in enumerate(p for p in _field_paths(content) if keep(p)):
            current = content
            for key in path:
                current = current[key]
            wrong = 5 if isinstance(current, str) else {"x": 1} if current is None else "x"
            name = ".".join(str(k) for k in path)
            reader = readers[i % 3]
            cases.append(Case(id=f"plan-rehashed-{algorithm}-{name}-{reader}", argv=(reader, "plan.json"),
                              expect="reject", inputs=(Artefact("plan.json", artefact, _rehashed(path, wrong)),)))
    return cases


def _moved_to_nonsensitive(column: str):
    """A plan edited to list a sensitive column as non-sensitive, its hash recomputed: consistent in itself."""
    def edit(data: bytes) -> bytes:
        import hashlib

        from budgetplan.plan import canonical_json

        obj = json.loads(data)
        features = obj["scenario"]["features"]
        features["sensitive_categorical"] = [c for c in features["sensitive_categorical"] if c != column]
        features["nonsensitive_categorical"] = features["nonsensitive_categorical"] + [column]
        obj.pop("sha256")
        obj["sha256"] = hashlib.sha256(canonical_json(obj).encode("ascii")).hexdigest()
        return (json.dumps(obj, sort_keys=True, indent=2, ensure_ascii=True) + "\n").encode()
    return edit


def _signed_cases() -> list[Case]:
    """Only the signed-off scenario shows a re-hashed plan that moved a column between the groups."""
    from tests.fuzz.artefacts import train_scenario

    signed = Text("s.toml", train_scenario())
    moved = Artefact("plan.json", "plan-train", _moved_to_nonsensitive("past_site"))
    data = Artefact("train.parquet", "train-parquet")
    train = ("train", "plan.json", "--data", "train.parquet", "--out", "run", "--embedding-dim", "1")
    return [
        Case("plan-moved-to-nonsensitive-verify-signed", ("verify", "plan.json", "--scenario", "s.toml"), "reject",
             inputs=(moved, signed)),
        Case("plan-moved-to-nonsensitive-train-signed", train + ("--scenario", "s.toml"), "reject",
             inputs=(moved, signed, data)),
        Case("plan-train-signed", train + ("--scenario", "s.toml", "--json"), "accept",
             inputs=(Artefact("plan.json", "plan-train"), signed, data), outputs=("run",)),
    ]


# ----------------------------------------------------------------- run records

RECORD_EDITS = (
    ("sha-wrong", _json_edit(_set_path("sha256", "0" * 64))),
    ("sha-missing", _json_edit(_drop_key("sha256"))),
    ("schema-4", _json_edit(_set_path("schema_version", 4))),
    ("schema-1", _json_edit(_set_path("schema_version", 1))),
    ("unknown-key", _json_edit(_set_path("zz", 1))),
    ("missing-key", _json_edit(_drop_key("phases"))),
    ("phases-not-list", _json_edit(_set_path("phases", 5))),
    ("plan-sha-other", _json_edit(_set_path("plan_sha256", "0" * 64))),
)


# A record's hash covers its content, not its layout (unlike a plan, it is not signed off
# byte for byte): these edits leave the content, and so the record, intact.
LAYOUT_ONLY = {"truncated-last-byte", "crlf", "cr-only", "no-final-newline", "extra-final-newline", "tab-indent",
               "compact"}


def _record_cases() -> list[Case]:
    cases = []
    for name, edit in BROKEN_JSON + RECORD_EDITS:
        run = Artefact("run", "run-rr", ("run.json", edit))
        expect = "accept" if name in LAYOUT_ONLY else "reject"
        cases.append(Case(id=f"record-{name}-audit", argv=("audit", "run"), expect=expect, inputs=(run,)))
        cases.append(Case(id=f"record-{name}-statement", argv=("statement", "run"), expect=expect, inputs=(run,)))
    for name, edit in BROKEN_JSON[:8] + RECORD_EDITS[:3]:
        run = Artefact("run", "run-rr", ("run.json", edit))
        cases.append(Case(id=f"record-{name}-frontier", argv=("plot", "frontier", "run", "-o", "f.png"),
                          expect="reject", inputs=(run,)))
        cases.append(Case(id=f"record-{name}-baseline", expect="reject",
                          argv=("train", "plan.json", "--data", "train.parquet", "--out", "new", "--baseline",
                                "run/run.json"),
                          inputs=(run, Artefact("plan.json", "plan-train"),
                                  Artefact("train.parquet", "train-parquet"))))
    for name, edit in BROKEN_JSON[:10] + PLAN_EDITS[:4]:
        run = Artefact("run", "run-rr", ("plan.json", edit))
        cases.append(Case(id=f"record-plan-{name}-audit", argv=("audit", "run"), expect="reject", inputs=(run,)))
        cases.append(Case(id=f"record-plan-{name}-statement", argv=("statement", "run"), expect="reject",
                          inputs=(run,)))
    run = Artefact("run", "run-rr")
    cases += [
        Case("record-valid-audit", ("audit", "run", "--json"), "accept", inputs=(run,)),
        Case("record-valid-statement", ("statement", "run"), "accept", inputs=(run,)),
        Case("record-valid-statement-file", ("statement", "run/run.json"), "accept", inputs=(run,)),
        Case("record-missing-audit", ("audit", "nope"), "reject"),
        Case("record-missing-statement", ("statement", "nope/run.json"), "reject"),
        Case("record-empty-dir-audit", ("audit", "d"), "reject", inputs=(Dir("d"),)),
        Case("record-empty-dir-statement", ("statement", "d"), "reject", inputs=(Dir("d"),)),
        Case("record-run-json-is-dir", ("audit", "d"), "reject", inputs=(Dir("d/run.json"),)),
        Case("record-plan-is-dir", ("audit", "run", "--plan", "d"), "reject", inputs=(run, Dir("d"))),
        Case("record-plan-missing", ("audit", "run", "--plan", "nope.json"), "reject", inputs=(run,)),
        Case("record-plan-other", ("audit", "run", "--plan", "other.json"), "reject",
             inputs=(run, Artefact("other.json", "plan-rr-impression"))),
        Case("record-statement-plan-other", ("statement", "run", "--plan", "other.json"), "reject",
             inputs=(run, Artefact("other.json", "plan-rr-impression"))),
        Case("record-no-plan-beside", ("audit", "r/run.json"), "reject",
             inputs=(Artefact("r", "run-rr", ("plan.json", lambda b: None)),)),
        Case("record-no-plan-beside-statement", ("statement", "r"), "reject",
             inputs=(Artefact("r", "run-rr", ("plan.json", lambda b: None)),)),
        Case("record-audit-data-missing", ("audit", "run", "--data", "nope.parquet"), "reject", inputs=(run,)),
        Case("record-audit-data-garbage", ("audit", "run", "--data", "g.parquet"), "reject",
             inputs=(run, Bytes("g.parquet", b"PAR1garbage"))),
        Case("record-audit-data-other", ("audit", "run", "--data", "e.parquet"), "reject",
             inputs=(run, Artefact("e.parquet", "eval-parquet"))),
        Case("record-audit-format-bad", ("audit", "run", "--data", "t.parquet", "--format", "xml"), "reject",
             inputs=(run, Artefact("t.parquet", "train-parquet"))),
        Case("record-ledger-edited", ("audit", "run"), "reject",
             inputs=(Artefact("run", "run-rr", ("ledger.jsonl", lambda b: b.replace(b'"open"', b'"opem"', 1))),)),
        Case("record-ledger-binary", ("audit", "run"), "reject",
             inputs=(Artefact("run", "run-rr", ("ledger.jsonl", lambda b: bytes(range(256)))),)),
        Case("record-ledger-missing", ("audit", "run"), "reject",
             inputs=(Artefact("run", "run-rr", ("ledger.jsonl", lambda b: None)),)),
        Case("frontier-non-private-only", ("plot", "frontier", "base", "-o", "f.png"), "reject",
             inputs=(Artefact("base", "run-baseline"),)),
        Case("frontier-no-relative-loss", ("plot", "frontier", "run", "-o", "f.png"), "reject", inputs=(run,)),
        # the run measured against itself (a loss of 0 by construction): the baseline is a non-private run
        Case("frontier-baseline-private", ("plot", "frontier", "run", "--baseline", "run/run.json", "-o", "f.png"),
             "reject", inputs=(run,)),
        Case("frontier-baseline", ("plot", "frontier", "run", "--baseline", "base/run.json", "-o", "f.png", "--json"),
             "accept", inputs=(run, Artefact("base", "run-baseline")), outputs=("f.png",)),
        Case("frontier-baseline-missing", ("plot", "frontier", "run", "--baseline", "nope.json", "-o", "f.png"),
             "reject", inputs=(run,)),
        Case("frontier-baseline-no-private", ("plot", "frontier", "run", "--baseline", "base/run.json", "-o",
                                              "f.png"),
             "reject", inputs=(run, Artefact("base", "run-baseline", ("private/record.json", lambda b: None)))),
    ]
    return cases


# --------------------------------------------------------------------- data


def _table_bytes(fmt: str, columns: dict, names=None) -> bytes:
    """A table in ``fmt`` ("parquet" or "csv") from python lists; ``names`` may repeat a column."""
    import io

    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    table = pa.table(list(columns.values()), names=names or list(columns))
    sink = io.BytesIO()
    if fmt == "parquet":
        pq.write_table(table, sink)
    else:
        pacsv.write_csv(table, sink)
    return sink.getvalue()


def _synthetic(rows: int = TRAIN_ROWS, seed: int = 1, users: int = 60) -> dict:
    import pyarrow as pa

    from trainers.data.synth import synthesize

    t = synthesize(rows, min(users, rows), seed)
    return {n: (c.cast(c.type.value_type) if pa.types.is_dictionary(c.type) else c).combine_chunks()
            for n, c in zip(t.column_names, t.columns)}


def _variant(fmt: str, rows: int = TRAIN_ROWS, **changes):
    """Synthetic data with some columns replaced (``None`` drops one); bytes in ``fmt``, built lazily."""
    def build(_: bytes) -> bytes:
        import pyarrow as pa

        cols = _synthetic(rows)
        for name, fn in changes.items():
            if fn is None:
                cols.pop(name)
            else:
                cols[name] = pa.array(fn(cols[name].to_pylist()))
        return _table_bytes(fmt, cols)
    return build


def _duplicate_label(_: bytes) -> bytes:
    cols = _synthetic()
    names = list(cols) + ["label"]
    return _table_bytes("csv", {**cols, "label2": cols["label"]}, names=names)


def _duplicate(column: str, fmt: str = "parquet"):
    """Synthetic data with ``column`` named twice (the second a copy of the first)."""
    def build(_: bytes) -> bytes:
        cols = _synthetic()
        return _table_bytes(fmt, {**cols, column + "-2": cols[column]}, names=list(cols) + [column])
    return build


def _at(i, value):
    def fn(values):
        values = list(values)
        values[i] = value
        return values
    return fn


def _every(value):
    return lambda values: [value] * len(values)


# (name, data bytes edit of train-parquet, file name, the uses it is fine for): eval data may
# have any number of rows; `data count` reads the unit id column only.
BAD_DATA = (
    ("empty-file", lambda b: b"", "d.parquet", ()),
    ("garbage-parquet", lambda b: b"PAR1" + bytes(range(256)) + b"PAR1", "d.parquet", ()),
    ("truncated-parquet", lambda b: b[: len(b) // 2], "d.parquet", ()),
    ("csv-named-parquet", _variant("csv"), "d.parquet", ()),
    ("parquet-named-csv", lambda b: b, "d.csv", ()),
    ("unknown-extension", lambda b: b, "d.txt", ()),
    ("binary-csv", lambda b: bytes(range(256)) * 8, "d.csv", ()),
    ("header-only-csv", lambda b: b"label,user_id\n", "d.csv", ("count",)),
    ("empty-csv", lambda b: b"", "d.csv", ()),
    ("ragged-csv", lambda b: b"label,user_id,publisher\n1,2\n0,3,4,5\n", "d.csv", ()),
    ("bad-gzip", lambda b: b"\x1f\x8b" + b"garbage" * 10, "d.csv.gz", ()),
    ("duplicate-label-csv", _duplicate_label, "d.csv", ()),
    # the column-at-a-time Parquet reader took the schema's field by name (KeyError)
    ("duplicate-label-parquet", _duplicate("label"), "d.parquet", ()),
    ("duplicate-feature-parquet", _duplicate("publisher"), "d.parquet", ()),
    ("label-missing", _variant("parquet", label=None), "d.parquet", ("count",)),
    ("label-two", _variant("parquet", label=_at(5, 2)), "d.parquet", ("count",)),
    ("label-nan", _variant("parquet", label=lambda v: [float(x) for x in _at(3, float("nan"))(v)]), "d.parquet",
     ("count",)),
    ("label-null", _variant("parquet", label=_at(0, None)), "d.parquet", ("count",)),
    ("label-string", _variant("parquet", label=lambda v: [str(x) for x in v]), "d.parquet", ("count",)),
    # one class: the run spent its budget on a constant and said nothing (eval: AUC is undefined)
    ("label-all-zero", _variant("parquet", label=_every(0)), "d.parquet", ("count",)),
    ("label-all-one", _variant("parquet", label=_every(1)), "d.parquet", ("count",)),
    ("label-negative", _variant("parquet", label=_at(7, -1)), "d.parquet", ("count",)),
    ("feature-nan", _variant("parquet", bid_floor=_at(4, float("nan"))), "d.parquet", ("count",)),
    ("feature-inf", _variant("parquet", bid_floor=_at(9, float("inf"))), "d.parquet", ("count",)),
    ("feature-all-nan", _variant("parquet", visits_7d=lambda v: [float("nan")] * len(v)), "d.parquet", ("count",)),
    ("feature-string-numeric", _variant("parquet", bid_floor=lambda v: ["x"] * len(v)), "d.parquet", ("count",)),
    ("feature-missing-column", _variant("parquet", past_site=None), "d.parquet", ("count",)),
    ("unit-id-null-string", _variant("parquet", user_id=lambda v: [None if i == 3 else f"u{x}"
                                                                   for i, x in enumerate(v)]), "d.parquet", ()),
    ("unit-id-nan", _variant("parquet", user_id=lambda v: [float("nan") if i == 3 else float(x)
                                                           for i, x in enumerate(v)]), "d.parquet", ()),
    ("unit-id-missing", _variant("parquet", user_id=None), "d.parquet", ()),
    ("fewer-rows", _variant("parquet", rows=TRAIN_ROWS - 1), "d.parquet", ("eval", "count")),
    ("more-rows", _variant("parquet", rows=TRAIN_ROWS + 1), "d.parquet", ("eval", "count")),
    ("one-row", _variant("parquet", rows=1), "d.parquet", ("count",)),
)


def _data_cases() -> list[Case]:
    cases = []
    user_plan = Artefact("plan.json", "plan-train-user")
    for name, edit, fname, fine in BAD_DATA:
        data = Artefact(fname, "train-parquet", edit)
        cases.append(Case(id=f"data-{name}-train", expect="reject",
                          argv=("train", "plan.json", "--data", fname, "--out", "run"),
                          inputs=(Artefact("plan.json", "plan-train"), data)))
        eval_ok = "eval" in fine
        cases.append(Case(id=f"data-{name}-eval", expect="accept" if eval_ok else "reject",
                          outputs=("run",) if eval_ok else (),
                          argv=("train", "plan.json", "--data", "train.parquet", "--eval", fname, "--out", "run"),
                          inputs=(Artefact("plan.json", "plan-train"), Artefact("train.parquet", "train-parquet"),
                                  data)))
    for name in ("unit-id-null-string", "unit-id-nan", "unit-id-missing"):
        edit, fname = next((e, f) for n, e, f, _ in BAD_DATA if n == name)
        data = Artefact(fname, "train-parquet", edit)
        cases.append(Case(id=f"data-{name}-user-train", expect="reject",
                          argv=("train", "plan.json", "--data", fname, "--out", "run"), inputs=(user_plan, data)))
        cases.append(Case(id=f"data-{name}-count", expect="reject",
                          argv=("data", "count", fname, "--unit-id", "user_id", "--unit-cap", "2"), inputs=(data,)))
    for name, edit, fname, fine in BAD_DATA[:12] + BAD_DATA[-3:]:
        cases.append(Case(id=f"data-{name}-count", expect="accept" if "count" in fine else "reject",
                          argv=("data", "count", fname, "--unit-id", "user_id", "--unit-cap", "2"),
                          inputs=(Artefact(fname, "train-parquet", edit),)))
    train = (Artefact("plan.json", "plan-train"), Artefact("train.parquet", "train-parquet"))
    cases += [
        Case("data-missing-train", ("train", "plan.json", "--data", "nope.parquet", "--out", "run"), "reject",
             inputs=train),
        Case("data-missing-eval", ("train", "plan.json", "--data", "train.parquet", "--eval", "missing.parquet",
                                   "--out", "run"), "reject", inputs=train),
        Case("data-eval-is-dir", ("train", "plan.json", "--data", "train.parquet", "--eval", "d", "--out", "run"),
             "reject", inputs=train + (Dir("d"),)),
        Case("data-format-mismatch", ("train", "plan.json", "--data", "train.parquet", "--format", "csv",
                                      "--out", "run"), "reject", inputs=train),
        Case("data-format-criteo", ("train", "plan.json", "--data", "train.parquet", "--format", "criteo-display",
                                    "--out", "run"), "reject", inputs=train),
        Case("data-count-missing", ("data", "count", "nope.parquet", "--unit-id", "u", "--unit-cap", "2"), "reject"),
        Case("data-count-no-column", ("data", "count", "t.parquet", "--unit-id", "uid", "--unit-cap", "2"), "reject",
             inputs=(Artefact("t.parquet", "train-parquet"),)),
        Case("data-count-empty-column-name", ("data", "count", "t.parquet", "--unit-id", "", "--unit-cap", "2"),
             "reject", inputs=(Artefact("t.parquet", "train-parquet"),)),
        Case("data-count-valid", ("data", "count", "t.parquet", "--unit-id", "user_id", "--unit-cap", "2",
                                  "--unit-cap", "100000", "--json"), "accept",
             inputs=(Artefact("t.parquet", "train-parquet"),)),
        Case("data-count-csv-valid", ("data", "count", "t.csv", "--unit-id", "user_id", "--unit-cap", "1", "--json"),
             "accept", inputs=(Artefact("t.csv", "train-csv"),)),
        Case("data-count-criteo-garbage", ("data", "count", "t.csv", "--unit-id", "uid", "--unit-cap", "1",
                                           "--format", "criteo-attribution"), "reject",
             inputs=(Artefact("t.csv", "train-csv"),)),
        Case("data-count-closed-dir", ("data", "count", "d/t.parquet", "--unit-id", "user_id", "--unit-cap", "1"),
             "reject", inputs=(Artefact("d/t.parquet", "train-parquet"), Dir("d", 0)), root_ok=False),
        Case("data-train-csv-valid", ("train", "plan.json", "--data", "t.csv", "--out", "run", "--embedding-dim", "1",
                                      "--json"), "accept", inputs=(Artefact("plan.json", "plan-train"),
                                                                   Artefact("t.csv", "train-csv")), outputs=("run",)),
        Case("data-train-eval-valid", ("train", "plan.json", "--data", "train.parquet", "--eval", "eval.parquet",
                                       "--out", "run", "--embedding-dim", "1", "--json"), "accept",
             inputs=train + (Artefact("eval.parquet", "eval-parquet"),), outputs=("run",)),
        Case("data-train-nulls-are-missing", ("train", "plan.json", "--data", "d.parquet", "--out", "run",
                                              "--embedding-dim", "1"), "accept",
             inputs=(Artefact("plan.json", "plan-train"),
                     Artefact("d.parquet", "train-parquet", _variant("parquet", bid_floor=_every(None)))),
             outputs=("run",)),
    ]
    return cases


def file_cases() -> list[Case]:
    return _plan_cases() + _rehashed_cases() + _signed_cases() + _record_cases() + _data_cases()
