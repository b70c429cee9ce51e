"""The contract between data loading and models: encoded, device-resident tensors.

Categorical features of each group share one embedding table (as in Chua et al.,
arXiv:2401.15246, appendix A: each value is prefixed with its feature name, then hashed or
looked up in a vocabulary), so ``ns_cat[i, j]`` is a row index into the non-sensitive
table of size ``ns_vocab`` and ``s_cat[i, j]`` into the sensitive table of size
``s_vocab``. Numeric features are already transformed by the fixed map sign(x) log1p(|x|),
with no data-dependent statistics (those would be a release of the sensitive columns).
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["EncodedData"]


@dataclass
class EncodedData:
    """Model-ready tensors, all on one device, row i of each describing example i.

    Attributes:
        ns_cat: int64 [N, n_ns_cat] ids into the non-sensitive embedding table.
        ns_num: float32 [N, n_ns_num] non-sensitive numeric features.
        s_cat: int64 [N, n_s_cat] ids into the sensitive embedding table.
        s_num: float32 [N, n_s_num] sensitive numeric features.
        label: float32 [N] in {0, 1}.
        unit: int64 [N] dense unit ids 0..U-1, or None when the data has no unit column.
        ns_vocab, s_vocab: sizes of the two embedding tables (>= 1 even when unused).
        names: column names per group, for records: keys "ns_cat", "ns_num", "s_cat", "s_num".
    """

    ns_cat: object
    ns_num: object
    s_cat: object
    s_num: object
    label: object
    unit: object | None
    ns_vocab: int
    s_vocab: int
    names: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.label.shape[0])

    def to(self, device) -> EncodedData:
        move = lambda t: None if t is None else t.to(device)  # noqa: E731
        return EncodedData(move(self.ns_cat), move(self.ns_num), move(self.s_cat), move(self.s_num),
                           move(self.label), move(self.unit), self.ns_vocab, self.s_vocab, dict(self.names))

    def take(self, index) -> EncodedData:
        """The rows at ``index`` (a tensor of row numbers or a boolean mask)."""
        pick = lambda t: None if t is None else t[index]  # noqa: E731
        return EncodedData(pick(self.ns_cat), pick(self.ns_num), pick(self.s_cat), pick(self.s_num),
                           pick(self.label), pick(self.unit), self.ns_vocab, self.s_vocab, dict(self.names))
