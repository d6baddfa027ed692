"""kernels/jit_keys.py: each JIT function's cache key computed after its callees' (the order that
makes Triton 3.6's keys the same in every process, whatever it launches first)."""

from __future__ import annotations

import types

from triton.runtime.jit import JITFunction

from megamoe.kernels import jit_keys

computed: list[str] = []  # the functions whose cache key was asked for, in order


class _Recorded(JITFunction):
    """A JIT function whose cache key only notes that it was asked for."""

    @property
    def cache_key(self):
        computed.append(self.fn.__name__)
        return self.fn.__name__


def _leaf_src(x):
    return x


def _mid_src(x):
    return leaf(x) * 2


def _top_src(x):
    return mid(x) + lib.leaf(x) + top(x)


leaf = mid = top = None  # the recorded functions, set by the test: the names the bodies call
lib = types.ModuleType("lib")  # a module whose attribute a body calls


def test_callees_are_settled_before_their_callers():
    global leaf, mid, top
    leaf, mid, top = _Recorded(_leaf_src), _Recorded(_mid_src), _Recorded(_top_src)
    lib.leaf = leaf
    assert jit_keys.callees(top) == [mid, leaf], "bare names and module attributes, itself left out"
    assert jit_keys.callees(leaf) == []
    computed.clear()
    jit_keys.settle({"top": top, "x": 1, "mid": mid})
    assert computed == ["_leaf_src", "_mid_src", "_top_src"], "each key after its callees', each once"


def test_every_kernel_module_settles_its_jit_functions():
    """A module that defines JIT functions ends by settling them; one that does not would compute its
    kernels' keys in whatever order a process launches them (Triton 3.6: another disk-cache key)."""
    import re
    from pathlib import Path

    root = Path(jit_keys.__file__).parent
    defining = [p for p in sorted(root.glob("*.py")) if re.search(r"^@triton\.jit", p.read_text(), re.M)]
    assert len(defining) >= 10, [p.name for p in defining]
    missing = [p.name for p in defining if not re.search(r"^settle\(globals\(\)\)", p.read_text(), re.M)]
    assert not missing, f"modules defining JIT functions without settle(globals()) at their end: {missing}"
