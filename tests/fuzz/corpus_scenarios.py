"""Scenario files for ``budgetplan plan``: every numeric key x bad values, and malformed TOML.

Key cases edit one value of a small valid scenario (``artefacts.SMALL_SCENARIOS``) and plan it
to stdout; an accepted extreme value must plan to a complete JSON plan.
"""

from __future__ import annotations

import re

from tests.fuzz.artefacts import SMALL_SCENARIOS
from tests.fuzz.harness import Bytes, Case, Dir, Text

__all__ = ["scenario_cases"]

# TOML spellings of the values tried on every numeric key.
TOML_VALUES = {
    "nan": "nan",
    "inf": "inf",
    "-inf": "-inf",
    "neg": "-1",
    "zero": "0",
    "big": "1e308",
    "tiny": "1e-300",
    "huge": "1" + "0" * 30,
    "2^63": str(2**63),
    "frac": "2.5",
    "string": '"8"',
    "bool": "true",
    "array": "[1]",
    "table": "{ a = 1 }",
}


def _set(text: str, table: str, key: str, value: str) -> str:
    """``text`` with ``[table].key`` set to ``value`` (replaced, or added to the table)."""
    head = f"[{table}]\n"
    start = text.index(head) + len(head)
    end = text.find("\n[", start)
    end = len(text) if end < 0 else end + 1
    body = text[start:end]
    line = re.compile(rf"^{re.escape(key)} = .*$", re.M)
    body = line.sub(f"{key} = {value}", body) if line.search(body) else f"{key} = {value}\n" + body
    return text[:start] + body + text[end:]


def _drop(text: str, key: str) -> str:
    return re.sub(rf"^{re.escape(key)} = .*\n", "", text, flags=re.M)


_USER_RR = _set(_set(SMALL_SCENARIOS["rr"], "privacy", "unit", '"user x time"'), "privacy", "cap", "2")
_TRUNCATED = _set(SMALL_SCENARIOS["dpsgd"], "dpsgd", "sampling", '"truncated-poisson"')
_TRUNCATED = _set(_TRUNCATED, "dpsgd", "max_batch_size", "200")
_DPSGD_EPOCHS = _set(_drop(SMALL_SCENARIOS["dpsgd"], "steps"), "dpsgd", "epochs", "0.2")
_TUNED = SMALL_SCENARIOS["rr"] + "\n[tuning]\nconfigurations = 4\n"
_GRID = SMALL_SCENARIOS["dpsgd"] + "\n[tuning]\nclipping_norm = [1.0, 2.0]\n"


# (id, base scenario, table, key, accepted values, values that may be answered or refused ("clean"));
# every other value must be refused
KEYS = (
    # beyond 700 the flip probability 1/(1 + e^eps) is not a positive float64: refused
    ("rr.budget.epsilon", SMALL_SCENARIOS["rr"], "budget", "epsilon", "frac tiny", ""),
    ("walr.budget.epsilon", SMALL_SCENARIOS["walr"], "budget", "epsilon", "frac huge 2^63 tiny", "big"),
    ("rr.budget.delta", SMALL_SCENARIOS["rr"], "budget", "delta", "zero tiny", ""),
    ("walr.budget.delta", SMALL_SCENARIOS["walr"], "budget", "delta", "tiny", ""),
    ("rr.data.dataset_size", SMALL_SCENARIOS["rr"], "data", "dataset_size", "", ""),
    ("dpsgd.data.dataset_size", SMALL_SCENARIOS["dpsgd"], "data", "dataset_size", "", ""),
    ("rr.privacy.cap", _USER_RR, "privacy", "cap", "", ""),
    ("rr.rr.epochs", SMALL_SCENARIOS["rr"], "rr", "epochs", "", ""),
    # a batch above N is refused as [dpsgd]'s is (1e308 and 10^30 were accepted)
    ("rr.rr.batch_size", SMALL_SCENARIOS["rr"], "rr", "batch_size", "", ""),
    ("dpsgd.dpsgd.batch_size", SMALL_SCENARIOS["dpsgd"], "dpsgd", "batch_size", "", ""),
    ("dpsgd.dpsgd.steps", SMALL_SCENARIOS["dpsgd"], "dpsgd", "steps", "", "!big"),
    ("dpsgd.dpsgd.epochs", _DPSGD_EPOCHS, "dpsgd", "epochs", "tiny frac", ""),
    ("dpsgd.dpsgd.clipping_norm", SMALL_SCENARIOS["dpsgd"], "dpsgd", "clipping_norm", "tiny huge 2^63 frac", ""),
    ("dpsgd.dpsgd.noise_multiplier", SMALL_SCENARIOS["dpsgd"], "dpsgd", "noise_multiplier",
     "frac huge 2^63", ""),
    ("dpsgd.dpsgd.max_noise_multiplier", _drop(SMALL_SCENARIOS["dpsgd"], "noise_multiplier"), "dpsgd",
     "max_noise_multiplier", "big huge 2^63 frac", ""),
    ("dpsgd.dpsgd.max_batch_size", _TRUNCATED, "dpsgd", "max_batch_size", "", ""),
    ("walr.walr.features", SMALL_SCENARIOS["walr"], "walr", "features", "", ""),
    ("walr.walr.row_norm_bound", SMALL_SCENARIOS["walr"], "walr", "row_norm_bound", "tiny huge 2^63 frac", ""),
    ("walr.walr.weights_bound", SMALL_SCENARIOS["walr"], "walr", "weights_bound", "tiny huge 2^63 frac", ""),
    ("rr.tuning.configurations", _TUNED, "tuning", "configurations", "", ""),
    ("dpsgd.accounting.discretization", _set(SMALL_SCENARIOS["dpsgd"], "accounting", "method", '"pld"'),
     "accounting", "discretization", "", "!big tiny !huge !2^63"),  # 2.5: no sigma meets it, a clean error
)


def _key_cases() -> list[Case]:
    cases = []
    for name, base, table, key, accept, either in KEYS:
        accept = set(accept.split())
        either = {v: "clean" for v in either.split() if not v.startswith("!")}
        for label, value in TOML_VALUES.items():
            expect = "accept" if label in accept else either.get(label, "reject")
            cases.append(Case(id=f"scenario-{name}={label}", argv=("plan", "s.toml"), expect=expect,
                              inputs=(Text("s.toml", _set(base, table, key, value)),)))
    return cases


_RR = SMALL_SCENARIOS["rr"]
_HY = SMALL_SCENARIOS["hybrid"]

# (id, scenario text or bytes, expect)
TEXTS = (
    ("empty", "", "reject"),
    ("blank-lines", "\n\n\n", "reject"),
    ("binary", b"\x00\x01\x02\xff\xfe" * 100, "reject"),
    ("invalid-utf8", _RR.replace('"fuzz-rr"', '"fuzz') .encode() + b"\xff\xfe\"\n", "reject"),
    ("utf8-bom", b"\xef\xbb\xbf" + _RR.encode(), "reject"),
    ("not-toml", "this is not toml\n", "reject"),
    ("unclosed-table", "[budget\nepsilon = 1\n", "reject"),
    ("unclosed-string", 'name = "abc\n' + _RR, "reject"),
    ("duplicate-key", _RR.replace("epsilon = 2.0", "epsilon = 2.0\nepsilon = 3.0"), "reject"),
    ("duplicate-table", _RR + "\n[budget]\nepsilon = 1\n", "reject"),
    ("unknown-top-key", "colour = 1\n" + _RR, "reject"),
    ("unknown-table", _RR + "\n[extra]\na = 1\n", "reject"),
    ("unknown-key-in-table", _set(_RR, "budget", "epsilom", "1"), "reject"),
    ("missing-budget", _RR.replace("[budget]\nepsilon = 2.0\ndelta = 0.0\n", ""), "reject"),
    ("missing-epsilon", _drop(_RR, "epsilon"), "reject"),
    ("missing-delta", _drop(_RR, "delta"), "reject"),
    ("missing-dataset-size", _drop(_RR, "dataset_size"), "reject"),
    ("missing-algorithm-name", _RR.replace('[algorithm]\nname = "rr"', "[algorithm]"), "reject"),
    ("budget-not-table", _RR.replace("[budget]\nepsilon = 2.0\ndelta = 0.0\n", "budget = 3\n"), "reject"),
    ("budget-array-of-tables", _RR.replace("[budget]", "[[budget]]"), "reject"),
    ("nested-arrays-deep", "x = " + "[" * 5000 + "]" * 5000 + "\n" + _RR, "reject"),
    ("nested-tables-deep", "x = " + "{a = " * 3000 + "1" + "}" * 3000 + "\n" + _RR, "reject"),
    # a 2 MB line, and a name past MAX_TEXT_CHARS (a 20 MB name took 10 s and 0.5 GB to plan)
    ("long-line", "name = \"" + "a" * 2_000_000 + "\"\n" + _RR.replace('name = "fuzz-rr"\n', ""), "reject"),
    ("name-at-limit", "name = \"" + "a" * 10_000 + "\"\n" + _RR.replace('name = "fuzz-rr"\n', ""), "accept"),
    ("description-above-limit", 'description = "' + "d" * 10_001 + '"\n' + _RR, "reject"),
    ("name-empty", _RR.replace('name = "fuzz-rr"', 'name = ""'), "reject"),
    ("name-number", _RR.replace('name = "fuzz-rr"', "name = 3"), "reject"),
    ("name-non-ascii", _RR.replace('name = "fuzz-rr"', 'name = "Anzeigen-Prüfung ✓"'), "accept"),
    ("name-newline", _RR.replace('name = "fuzz-rr"', 'name = "two\\nlines"'), "accept"),
    ("name-nul", _RR.replace('name = "fuzz-rr"', 'name = "a\\u0000b"'), "accept"),
    ("delta-string-1/N", _set(_RR, "budget", "delta", '"1/N"'), "accept"),
    ("delta-string-0/N", _set(_RR, "budget", "delta", '"0/N"'), "reject"),
    ("delta-string-neg/N", _set(_RR, "budget", "delta", '"-1/N"'), "reject"),
    ("delta-string-nan/N", _set(_RR, "budget", "delta", '"nan/N"'), "reject"),
    ("delta-string-inf/N", _set(_RR, "budget", "delta", '"1e400/N"'), "reject"),
    ("delta-string-big/N", _set(_RR, "budget", "delta", '"20000/N"'), "reject"),
    ("delta-string-/M", _set(_RR, "budget", "delta", '"1/M"'), "reject"),
    ("delta-one", _set(_RR, "budget", "delta", "1"), "reject"),
    ("delta-policy-bad", _set(_RR, "budget", "delta_policy", '"lenient"'), "reject"),
    ("delta-strict-above-1/N", _set(_set(_RR, "budget", "delta_policy", '"strict"'), "budget", "delta",
                                    "0.5"), "reject"),
    ("adjacency-bad", _set(_RR, "privacy", "adjacency", '"swap"'), "reject"),
    ("adjacency-add-remove-rr", _set(_RR, "privacy", "adjacency", '"add-remove"'), "reject"),
    ("unit-empty", _set(_RR, "privacy", "unit", '""'), "reject"),
    ("unit-user-no-cap", _set(_RR, "privacy", "unit", '"user"'), "reject"),
    ("cap-with-impression", _set(_RR, "privacy", "cap", "3"), "reject"),
    ("cap-limit", _set(_USER_RR, "privacy", "cap", "100000"), "accept"),
    ("cap-above-limit", _set(_USER_RR, "privacy", "cap", "100001"), "reject"),
    ("capping-bad", _set(_USER_RR, "privacy", "capping", '"last"'), "reject"),
    ("unit-accounting-bad", _set(_USER_RR, "privacy", "unit_accounting", '"loose"'), "reject"),
    ("dataset-size-limit", _set(_RR, "data", "dataset_size", str(10**12)), "accept"),
    ("dataset-size-above-limit", _set(_RR, "data", "dataset_size", str(10**12 + 1)), "reject"),
    ("dataset-size-1e18", _set(_RR, "data", "dataset_size", str(10**18)), "reject"),
    ("dataset-size-int64-max", _set(_RR, "data", "dataset_size", str(2**63 - 1)), "reject"),
    ("dataset-size-float-1e18", _set(_RR, "data", "dataset_size", "1e18"), "reject"),
    ("rr-epochs-limit", _set(_RR, "rr", "epochs", "10000"), "accept"),
    ("rr-epochs-1e9", _set(_RR, "rr", "epochs", "1000000000"), "reject"),
    ("rr-per-impression-bad", _set(_RR, "rr", "per_impression", '"eps/2"'), "reject"),
    ("algorithm-bad", _RR.replace('name = "rr"', 'name = "ridge"'), "reject"),
    ("table-for-other-algorithm", _RR + "\n[walr]\nfeatures = 3\nrow_norm_bound = 1.0\nweights_bound = 1.0\n",
     "reject"),
    ("split-on-rr", _RR.replace('name = "rr"', 'name = "rr"\nsplit = "alpha=0.5"'), "reject"),
    ("split-spaces", _HY.replace('split = "alpha=0.5"', 'split = "alpha = 0.5"'), "reject"),
    ("split-trailing-space", _HY.replace('split = "alpha=0.5"', 'split = "alpha=0.5 "'), "reject"),
    ("split-alpha-nan", _HY.replace('split = "alpha=0.5"', 'split = "alpha=nan"'), "reject"),
    ("split-alpha-1.5", _HY.replace('split = "alpha=0.5"', 'split = "alpha=1.5"'), "reject"),
    ("split-alpha-neg", _HY.replace('split = "alpha=0.5"', 'split = "alpha=-0.1"'), "reject"),
    ("split-eps1-total", _HY.replace('split = "alpha=0.5"', 'split = "eps1=8"'), "reject"),
    ("split-eps1-above", _HY.replace('split = "alpha=0.5"', 'split = "eps1=9"'), "reject"),
    ("split-eps1-zero", _HY.replace('split = "alpha=0.5"', 'split = "eps1=0"'), "reject"),
    ("split-eps1-inf", _HY.replace('split = "alpha=0.5"', 'split = "eps1=inf"'), "reject"),
    ("split-eps1-valid", _HY.replace('split = "alpha=0.5"', 'split = "eps1=2.5"'), "accept"),
    ("split-alpha-one", _HY.replace('split = "alpha=0.5"', 'split = "alpha=1"'), "accept"),
    ("split-number", _HY.replace('split = "alpha=0.5"', "split = 0.5"), "reject"),
    # a falsy split or tower became the default (paper-v1 / alpha-by-eps, frozen)
    ("split-negative-zero", _HY.replace('split = "alpha=0.5"', "split = -0.0"), "reject"),
    ("split-empty", _HY.replace('split = "alpha=0.5"', 'split = ""'), "reject"),
    ("split-false", _HY.replace('split = "alpha=0.5"', "split = false"), "reject"),
    ("tower-empty", _HY.replace('split = "alpha=0.5"', 'split = "alpha=0.5"\ntower = ""'), "reject"),
    ("split-paper-upper", _HY.replace('split = "alpha=0.5"', 'split = "PAPER-V1"'), "reject"),
    ("tower-bad", _HY.replace('split = "alpha=0.5"', 'split = "alpha=0.5"\ntower = "thawed"'), "reject"),
    ("rr-batch-above-n", _set(_RR, "rr", "batch_size", "10001"), "reject"),
    ("rr-batch-10^18", _set(_RR, "rr", "batch_size", str(10**18)), "reject"),
    ("rr-batch-at-n", _set(_RR, "rr", "batch_size", "10000"), "accept"),
    ("dpsgd-noise-above-max", _set(SMALL_SCENARIOS["dpsgd"], "dpsgd", "max_noise_multiplier", "1.5"), "reject"),
    ("dpsgd-noise-at-max", _set(SMALL_SCENARIOS["dpsgd"], "dpsgd", "max_noise_multiplier", "2.0"), "accept"),
    ("dpsgd-both-steps-epochs", _set(SMALL_SCENARIOS["dpsgd"], "dpsgd", "epochs", "1"), "reject"),
    ("dpsgd-neither-steps-epochs", _drop(SMALL_SCENARIOS["dpsgd"], "steps"), "reject"),
    ("dpsgd-batch-above-n", _set(SMALL_SCENARIOS["dpsgd"], "dpsgd", "batch_size", "10001"), "reject"),
    ("dpsgd-max-batch-below-batch", _set(_TRUNCATED, "dpsgd", "max_batch_size", "99"), "reject"),
    ("dpsgd-max-batch-above-n", _set(_TRUNCATED, "dpsgd", "max_batch_size", "10001"), "reject"),
    ("dpsgd-max-batch-without-truncation", _set(SMALL_SCENARIOS["dpsgd"], "dpsgd", "max_batch_size", "200"),
     "reject"),
    ("dpsgd-sampling-bad", _set(SMALL_SCENARIOS["dpsgd"], "dpsgd", "sampling", '"shuffle"'), "reject"),
    ("dpsgd-clipping-overflow-2C", _set(SMALL_SCENARIOS["dpsgd"], "dpsgd", "clipping_norm", "1e305"), "reject"),
    ("dpsgd-noise-times-clip-overflow", _set(_set(SMALL_SCENARIOS["dpsgd"], "dpsgd", "noise_multiplier", "1e300"),
                                             "dpsgd", "clipping_norm", "1e10"), "reject"),
    ("dpsgd-pure-delta", _set(SMALL_SCENARIOS["dpsgd"], "budget", "delta", "0"), "reject"),
    ("dpsgd-too-little-noise", _set(SMALL_SCENARIOS["dpsgd"], "dpsgd", "noise_multiplier", "0.3"), "reject"),
    # issue 26: a fixed noise multiplier of 0.01 and N = 10^12, accounted by PLD, each within the stated bound
    ("dpsgd-pld-noise-0.01", _set(_set(SMALL_SCENARIOS["dpsgd"], "dpsgd", "noise_multiplier", "0.01"), "accounting",
                                  "method", '"pld"'), "reject"),
    ("dpsgd-pld-dataset-size-limit", _set(_set(SMALL_SCENARIOS["dpsgd"], "data", "dataset_size", str(10**12)),
                                          "accounting", "method", '"pld"'), "clean"),
    ("walr-norm-product-overflow", _set(_set(SMALL_SCENARIOS["walr"], "walr", "row_norm_bound", "1e200"), "walr",
                                        "weights_bound", "1e200"), "reject"),
    ("walr-pure-delta", _set(SMALL_SCENARIOS["walr"], "budget", "delta", "0"), "reject"),
    ("tuning-bad-selection", _TUNED.replace("configurations = 4", "configurations = 4\nselection = \"best\""),
     "reject"),
    ("tuning-bad-distribution", _TUNED.replace("configurations = 4", "configurations = 4\nselection = "
                                               "\"repeat-and-select\"\ndistribution = \"uniform\""), "reject"),
    ("tuning-empty", _RR + "\n[tuning]\n", "reject"),
    ("grid-ok", _GRID, "accept"),
    ("grid-clipping-overflow", _GRID.replace("[1.0, 2.0]", "[1.0, 1e305]"), "reject"),
    ("grid-duplicate", _GRID.replace("[1.0, 2.0]", "[1.0, 1.0]"), "reject"),
    ("grid-of-one", _GRID.replace("[1.0, 2.0]", "[1.0]"), "reject"),
    ("grid-empty", _GRID.replace("[1.0, 2.0]", "[]"), "reject"),
    ("grid-not-a-list", _GRID.replace("[1.0, 2.0]", "1.0"), "reject"),
    ("grid-nested", _GRID.replace("[1.0, 2.0]", "[[1.0], [2.0]]"), "reject"),
    ("grid-nan", _GRID.replace("[1.0, 2.0]", "[1.0, nan]"), "reject"),
    ("grid-string", _GRID.replace("[1.0, 2.0]", '[1.0, "2"]'), "reject"),
    ("grid-lr-inf", _GRID + "dpsgd_learning_rate = [0.01, inf]\n", "reject"),
    ("grid-lr-too-big", _GRID + "dpsgd_learning_rate = [0.01, 100.0]\n", "reject"),
    ("grid-split-not-hybrid", _GRID + 'split = ["alpha=0.5", "alpha=0.25"]\n', "reject"),
    ("grid-count-disagrees", _GRID + "configurations = 3\n", "reject"),
    ("grid-repeat-and-select", _GRID + 'selection = "repeat-and-select"\n', "reject"),
    ("grid-share-one", _GRID + "selection_share = 1.0\n", "reject"),
    ("grid-share-nan", _GRID + "selection_share = nan\n", "reject"),
    ("grid-clip-half", _GRID + "prediction_clip = 0.5\n", "reject"),
    ("grid-validation-zero", _GRID + "validation_fraction = 0.0\n", "reject"),
    ("grid-share-without-grid", _TUNED + "selection_share = 0.1\n", "reject"),
    ("grid-truncated", _TRUNCATED + "\n[tuning]\nclipping_norm = [1.0, 2.0]\n", "reject"),
    ("accounting-method-bad", _set(SMALL_SCENARIOS["dpsgd"], "accounting", "method", '"moments"'), "reject"),
    ("features-no-label", _RR + '\n[features]\nnonsensitive_numeric = ["a"]\n', "reject"),
    ("features-empty-label", _RR + '\n[features]\nlabel = ""\nnonsensitive_numeric = ["a"]\n', "reject"),
    ("features-no-columns", _RR + '\n[features]\nlabel = "y"\n', "reject"),
    ("features-column-twice", _RR + '\n[features]\nlabel = "y"\nnonsensitive_numeric = ["a", "a"]\n', "reject"),
    ("features-column-two-groups", _RR + '\n[features]\nlabel = "y"\nnonsensitive_numeric = ["a"]\n'
                                         'sensitive_numeric = ["a"]\n', "reject"),
    ("features-label-is-feature", _RR + '\n[features]\nlabel = "a"\nnonsensitive_numeric = ["a"]\n', "reject"),
    ("features-not-list", _RR + '\n[features]\nlabel = "y"\nnonsensitive_numeric = "a"\n', "reject"),
    ("features-empty-name", _RR + '\n[features]\nlabel = "y"\nnonsensitive_numeric = [""]\n', "reject"),
    ("features-weight-not-walr", _RR + '\n[features]\nlabel = "y"\nweight = "w"\nnonsensitive_numeric = ["a"]\n',
     "reject"),
    ("features-unit-id-is-feature", _USER_RR + '\n[features]\nlabel = "y"\nunit_id = "u"\nnonsensitive_numeric = '
                                                '["a"]\nsensitive_numeric = ["u"]\n', "reject"),
    ("features-unit-id-is-label", _USER_RR + '\n[features]\nlabel = "u"\nunit_id = "u"\nnonsensitive_numeric = '
                                              '["a"]\n', "reject"),
    ("features-unit-id-valid", _USER_RR + '\n[features]\nlabel = "y"\nunit_id = "u"\nnonsensitive_numeric = '
                                          '["a"]\n', "accept"),
    ("features-user-without-unit-id", _USER_RR + '\n[features]\nlabel = "y"\nnonsensitive_numeric = ["a"]\n',
     "reject"),
)


def _text_cases() -> list[Case]:
    cases = []
    for name, text, expect in TEXTS:
        item = Bytes("s.toml", text) if isinstance(text, bytes) else Text("s.toml", text)
        cases.append(Case(id=f"scenario-{name}", argv=("plan", "s.toml"), expect=expect, inputs=(item,)))
    return cases


def _source_cases() -> list[Case]:
    rr = Text("s.toml", _RR)
    return [
        Case("scenario-missing-file", ("plan", "nope.toml"), "reject"),
        Case("scenario-is-directory", ("plan", "d"), "reject", inputs=(Dir("d"),)),
        Case("scenario-empty-path", ("plan", ""), "reject"),
        Case("scenario-in-closed-dir", ("plan", "d/s.toml"), "reject", inputs=(Text("d/s.toml", _RR), Dir("d", 0)),
             root_ok=False),
        Case("scenario-example-unknown", ("plan", "example:nope"), "reject"),
        Case("scenario-example-empty", ("plan", "example:"), "reject"),
        Case("scenario-example-traversal", ("plan", "example:../../pyproject"), "reject"),
        Case("scenario-dash-dash", ("plan", "--", "-s.toml"), "reject"),
        Case("scenario-json-flag-stdout", ("plan", "s.toml", "--json"), "accept", inputs=(rr,)),
        Case("examples-unknown", ("examples", "nope"), "reject"),
        Case("examples-empty", ("examples", ""), "reject"),
        Case("examples-traversal", ("examples", "../plan"), "reject"),
        Case("examples-list", ("examples", "--json"), "accept"),
        Case("examples-one", ("examples", "walr", "--json"), "accept"),
    ]


def scenario_cases() -> list[Case]:
    return _key_cases() + _text_cases() + _source_cases()
