"""The checkout never shadows an installed distribution: the tests import what ``pip install`` put in place.

``kernels``, ``reference`` and ``simulator`` are folders of this checkout that install as ``megamoe.*``;
PyPI has distributions by the first bare name (transformers 5.25 needs ``kernels``). ``python -m pytest``
puts the working directory first on ``sys.path``; ``tests/conftest.py`` takes the checkout's root off it.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _installed(dist: str) -> bool:
    try:
        importlib.metadata.distribution(dist)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def test_checkout_root_is_not_on_sys_path():
    """Whatever started pytest, no entry of sys.path is the checkout's root."""
    assert all(Path(p or ".").resolve() != ROOT for p in sys.path)


@pytest.mark.parametrize("name", ["kernels", "reference", "simulator"])
def test_bare_names_resolve_outside_the_checkout(name):
    """A bare ``import kernels`` (and the others) finds an installed distribution or nothing, never our folder."""
    spec = importlib.util.find_spec(name)
    if spec is not None and spec.origin:
        assert not Path(spec.origin).resolve().is_relative_to(ROOT), f"{name} resolves to {spec.origin}"


def test_megamoe_rooms_import_under_the_package():
    """The three rooms import as megamoe.* from the checkout (an editable install) or site-packages."""
    import megamoe.kernels
    import megamoe.reference
    import megamoe.simulator

    for mod in (megamoe.kernels, megamoe.reference, megamoe.simulator):
        assert mod.__name__.startswith("megamoe.")


def test_transformers_hub_kernels_integration_imports():
    """transformers' hub integration imports PyPI's ``kernels`` when it is installed (the shadowing's symptom
    was ``cannot import name 'CUDAProperties' from 'kernels'``)."""
    pytest.importorskip("transformers")
    if not _installed("kernels"):
        pytest.skip("the PyPI distribution 'kernels' is not installed, so nothing can shadow it")
    import kernels  # noqa: F401  (PyPI's)
    import transformers.integrations.hub_kernels as hub

    assert not Path(kernels.__file__).resolve().is_relative_to(ROOT)
    assert hub is not None

