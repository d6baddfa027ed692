"""Every notebook runs top to bottom (code cells executed in-process, plots to a non-GUI backend).

Notebooks only import and plot; this checks that they still agree with the package's API.
"""

from __future__ import annotations

from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs(path, monkeypatch, tmp_path):
    nbformat = pytest.importorskip("nbformat")
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    monkeypatch.setattr(plt, "show", lambda *a, **k: None)
    monkeypatch.chdir(tmp_path)  # anything a notebook writes lands here
    nb = nbformat.read(path, as_version=4)
    ns: dict = {"__name__": "__notebook__"}
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        src = "\n".join(line for line in cell.source.splitlines() if not line.lstrip().startswith(("%", "!")))
        try:
            exec(compile(src, f"{path.name}[cell {i}]", "exec"), ns)
        except Exception as exc:  # noqa: BLE001 - re-raised with the cell named
            raise AssertionError(f"{path.name}: cell {i} failed: {exc!r}") from exc
    plt.close("all")


def test_there_are_notebooks():
    assert NOTEBOOKS, "notebooks/ holds no .ipynb"
