"""Worked example scenarios shipped with budgetplan (``budgetplan examples``)."""

from __future__ import annotations

import tomllib
from importlib import resources
from pathlib import Path

from budgetplan.errors import InvalidParameterError

__all__ = ["names", "path", "text", "describe"]

PREFIX = "example:"


def _files():
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
    return tomllib.loads(text(name)).get("description", "")


def path(name: str) -> Path:
    """A filesystem path to the example (the package is installed as plain files)."""
    text(name)
    return Path(str(resources.files(__package__) / f"{name}.toml"))
