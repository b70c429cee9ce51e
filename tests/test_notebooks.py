"""The notebooks run top to bottom, draw their figures in a temporary directory, and write
nothing into the repository.

Each notebook is executed with nbclient on the ``python3`` kernel (ipykernel, this
interpreter), in a scratch working directory, with PYTHONPATH naming this checkout (so the
kernel and the CLI subprocesses it starts import this ``budgetplan`` and ``trainers``) and
TMPDIR pointing into pytest's tmp_path (so the notebook's ``tempfile.mkdtemp()`` lands
there and is cleaned up). Their defaults take about a minute each on a 2-core CPU.
"""

from __future__ import annotations

import importlib.util
import json
import os
import time
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")
pytest.importorskip("matplotlib")
pytest.importorskip("torch")
pytest.importorskip("pyarrow")

REPO = Path(__file__).resolve().parent.parent
NOTEBOOKS = REPO / "notebooks"
EXPECTED_PNGS = {
    "01_plan_a_budget.ipynb": {"epsilon_curve.png", "epsilon_curve_cli.png", "user_level.png"},
    "02_plan_then_train.ipynb": {"frontier.png", "frontier_cli.png"},
    "03_audit_a_run.ipynb": {"rr_empirical.png"},
}
CELL_TIMEOUT = 300  # seconds, per cell
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# Not the repository's content: caches, virtual environments, build output.
_SKIP_DIRS = {".git", ".venv", "venv", "__pycache__", ".pytest_cache", ".hypothesis", ".ruff_cache", ".mypy_cache",
              "build", "dist", "node_modules"}


def _repo_files() -> set[str]:
    out = set()
    for root, dirs, files in os.walk(REPO):
        dirs[:] = [d for d in dirs if d not in _SKIP_DIRS and not d.endswith(".egg-info")]
        rel = Path(root).relative_to(REPO)
        out.update(str(rel / f) for f in files if not f.endswith(".pyc"))
    return out


def _stream_text(cell) -> str:
    return "".join(o.get("text", "") for o in cell.get("outputs", []) if o.get("output_type") == "stream")


@pytest.mark.parametrize("name", sorted(EXPECTED_PNGS))
def test_notebook_runs_top_to_bottom(name, tmp_path, monkeypatch):
    tmp = tmp_path / "tmp"
    cwd = tmp_path / "cwd"
    tmp.mkdir()
    cwd.mkdir()
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p))
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    before = _repo_files()

    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=CELL_TIMEOUT, kernel_name="python3",
                                     resources={"metadata": {"path": str(cwd)}})
    t0 = time.perf_counter()
    client.execute()  # raises CellExecutionError, naming the cell, on any error
    print(f"{name}: {time.perf_counter() - t0:.1f} s")

    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors, errors
    last = [c for c in nb.cells if c.cell_type == "code"][-1]
    line = next((ln for ln in _stream_text(last).splitlines() if ln.startswith("outputs: ")), None)
    assert line is not None, f"{name}: the last cell printed no 'outputs:' line"
    outputs = json.loads(line[len("outputs: "):])
    work = Path(outputs["work_dir"]).resolve()
    assert work.is_relative_to(tmp.resolve()), f"{name} wrote to {work}, not a tempfile.mkdtemp() directory"
    pngs = [Path(p) for p in outputs["pngs"]]
    assert {p.name for p in pngs} == EXPECTED_PNGS[name]
    for png in pngs:
        assert png.resolve().is_relative_to(work), png
        assert png.read_bytes()[:8] == PNG_MAGIC, f"{png} is not a PNG"
    shown = sum("image/png" in o.get("data", {}) for c in nb.cells for o in c.get("outputs", [])
                if o.get("output_type") == "display_data")
    assert shown >= len(pngs)

    created = _repo_files() - before
    assert not created, f"{name} created files in the repository: {sorted(created)}"


def _builder():
    spec = importlib.util.spec_from_file_location("build_notebooks", NOTEBOOKS / "build_notebooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", sorted(EXPECTED_PNGS))
def test_notebook_is_stored_clean(name):
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    nbformat.validate(nb)
    assert nb.metadata["kernelspec"]["name"] == "python3"
    assert nb.cells[0].cell_type == "markdown" and nb.cells[0].source.startswith("# ")
    assert nb.cells[1].cell_type == "code" and nb.cells[1].source.startswith("# Parameters")
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, f"{name}: stored with outputs"
    assert "mkdtemp" in "".join(c.source for c in nb.cells)
    # The notebooks are generated: edit notebooks/build_notebooks.py, then run it.
    assert (NOTEBOOKS / name).read_text(encoding="utf-8") == _builder().render(name), (
        f"{name} differs from notebooks/build_notebooks.py: run `python notebooks/build_notebooks.py`")
