"""Triton disk-cache keys that do not depend on the order a process first uses its kernels.

A kernel's key in Triton's disk cache holds its ``cache_key``: a hash of its source, of the keys of
the JIT functions it calls and of the constexpr globals they use. Triton 3.6 merges a callee's
globals into its caller's before it has computed the callee's own key (``DependenciesFinder._update_hash``
reads ``func.used_global_vals`` first, then ``func.cache_key``), so where a callee's key was not yet
computed its globals are left out. A kernel's key then depends on which kernels' keys the process
computed before it. On an H100 (commit 4d170ea, 2026-12-07, ``benchmarks/cold_start.py``) this is
why ``megamoe compile`` (the multi-launch path, then the megakernel, in one process) did not fill
the cache for a process that calls the megakernel alone: same specialization, another source hash.

``settle(namespace)``, called at the end of each module that defines JIT functions, computes the
key of each of them callees first, so that every caller's key is made from complete callees: the
same keys in every process, whatever is launched first. Under the interpreter there is nothing to
settle (its functions have no disk cache).
"""

from __future__ import annotations

import ast
from types import ModuleType

from triton.runtime.jit import JITCallable


def callees(fn: JITCallable) -> list[JITCallable]:
    """The JIT functions ``fn``'s body names (bare, or as ``module.name``), each once, as ``ast.walk`` meets them."""
    g, out = fn.__globals__, []
    for node in ast.walk(fn.parse()):
        if isinstance(node, ast.Name):
            v = g.get(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            mod = g.get(node.value.id)
            v = getattr(mod, node.attr, None) if isinstance(mod, ModuleType) else None
        else:
            continue
        if isinstance(v, JITCallable) and v is not fn and v not in out:
            out.append(v)
    return out


#: each JIT function whose key is computed, callees first, by id (kept, so that no id is reused); a
#: module imported later parses only its own functions: those it imports were settled by their modules
_settled: dict[int, JITCallable] = {}


def _settle(fn: JITCallable) -> None:
    if id(fn) in _settled:
        return
    _settled[id(fn)] = fn
    for c in callees(fn):
        _settle(c)
    fn.cache_key  # noqa: B018 - computed now, its callees' before it


def settle(namespace: dict) -> None:
    """Compute the cache key of every JIT function in ``namespace`` (a module's globals), each one's
    callees first (module docstring); one already settled is not parsed again."""
    for v in list(namespace.values()):
        if isinstance(v, JITCallable):
            _settle(v)
