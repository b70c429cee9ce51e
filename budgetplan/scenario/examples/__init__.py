"""Worked example scenarios shipped with budgetplan (``budgetplan examples``)."""

from __future__ import annotations

import json
import re
import tomllib
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Protocol

from budgetplan.errors import InvalidParameterError

__all__ = ["names", "path", "text", "describe", "adapted", "set_key"]

PREFIX = "example:"


class _ToToml(Protocol):
    """What ``adapted`` needs of a ``FeatureSpec``: its ``[features]`` table as TOML."""

    def to_toml(self) -> str: ...


def _files() -> list[Traversable]:
    return sorted((f for f in resources.files(__package__).iterdir() if f.name.endswith(".toml")),
                  key=lambda f: f.name)


def names() -> list[str]:
    """Names of the shipped example scenarios."""
    return [f.name[: -len(".toml")] for f in _files()]


def text(name: str) -> str:
    """The TOML text of an example scenario."""
    for f in _files():
        if f.name == f"{name}.toml":
            return f.read_text(encoding="utf-8")
    raise InvalidParameterError(f"no example scenario named {name!r}; `budgetplan examples` lists them")


def describe(name: str) -> str:
    description: str = tomllib.loads(text(name)).get("description", "")
    return description


def path(name: str) -> Path:
    """A filesystem path to the example (the package is installed as plain files)."""
    text(name)
    return Path(str(resources.files(__package__) / f"{name}.toml"))


def set_key(toml: str, table: str, key: str, value: str | bool | int | float) -> str:
    """``toml`` with ``[table].key`` set to ``value`` (the line replaced, or added under the table's header).

    ``value`` is written as TOML: a string quoted, a bool lower-case, a number as Python prints it.
    Comments on a replaced line go with it, and so do the comment-only lines under it that
    continue that comment (a ``#`` in the same column): they described the old value.
    """
    lines = toml.splitlines()
    head = next((i for i, line in enumerate(lines) if re.match(rf"^\[{re.escape(table)}\]", line)), None)
    if head is None:
        raise InvalidParameterError(f"the scenario has no [{table}] table")
    end = next((i for i in range(head + 1, len(lines)) if lines[i].startswith("[")), len(lines))
    written = json.dumps(value) if isinstance(value, (str, bool)) else repr(value)
    for i in range(head + 1, end):
        if re.match(rf"^{re.escape(key)}\s*=", lines[i]):
            column = _comment_column(lines[i])
            after = i + 1
            while column is not None and after < end and re.fullmatch(rf" {{{column}}}#.*", lines[after]):
                after += 1
            lines[i:after] = [f"{key} = {written}"]
            return "\n".join(lines) + "\n"
    lines.insert(head + 1, f"{key} = {written}")
    return "\n".join(lines) + "\n"


def _comment_column(line: str) -> int | None:
    """The column of the comment that ends a ``key = value`` line (None: no comment): the first
    ``#`` whose prefix parses to what the whole line does (a ``#`` inside a string does not)."""
    try:
        whole = tomllib.loads(line)
    except tomllib.TOMLDecodeError:
        return None
    for hash_sign in re.finditer("#", line):
        try:
            if tomllib.loads(line[:hash_sign.start()]) == whole:
                return hash_sign.start()
        except tomllib.TOMLDecodeError:
            continue
    return None


def adapted(name: str, *, epsilon: float | None = None, dataset_size: int | None = None, split: str | None = None,
            tower: str | None = None, features: _ToToml | None = None, scenario_name: str | None = None) -> str:
    """An example scenario as a user adapts it: its epsilon, N, Hybrid split and tower, and its
    ``[features]`` table (a ``FeatureSpec``) replaced where given, everything else as shipped."""
    toml = text(name)
    if features is not None:
        found = re.search(r"(?m)^\[features\]", toml)
        toml = (toml[:found.start()] if found else toml.rstrip() + "\n\n") + features.to_toml()
    if scenario_name is not None:
        toml = re.sub(r"(?m)^name = .*$", f"name = {json.dumps(scenario_name)}", toml, count=1)
    for table, key, value in (("budget", "epsilon", None if epsilon is None else float(epsilon)),
                              ("data", "dataset_size", None if dataset_size is None else int(dataset_size)),
                              ("algorithm", "split", split), ("algorithm", "tower", tower)):
        if value is not None:
            toml = set_key(toml, table, key, value)
    return toml
