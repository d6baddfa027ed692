"""Intermediate buffers kept between eager calls of the layer (``get``), and the rule that makes
their reuse safe.

A workspace is the dict of every intermediate tensor one call needs for its shapes (routing
metadata, activations, pair buffer, split-K partials), made by the caller's ``make()``. It is kept
per (key, device, stream, host thread) and handed again to the next call with the same key there:
- one stream of one host thread runs its calls in order on the GPU, so a call's kernels are done
  with the buffers before the next call's kernels write them;
- never inside a CUDA-graph capture: a graph gets fresh buffers from the capture's pool, which it
  keeps for its replays;
- never a tensor handed to the caller: outputs are made per call;
- at most MAX_BYTES per workspace (larger ones, prefill sizes, are made per call: there the
  allocation is small against the GPU work) and MAX_ENTRIES in all, least recently used dropped.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import torch

#: the most bytes one kept workspace may hold, bytes
MAX_BYTES = 64 << 20
#: workspaces kept, all keys, devices, streams and threads together
MAX_ENTRIES = 64

_kept: OrderedDict = OrderedDict()  # (key, device, stream, thread) -> buffers


def nbytes(obj) -> int:
    """Bytes of the tensors in ``obj`` (a tensor, or dicts, tuples and lists of them)."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(nbytes(v) for v in obj.values())
    if isinstance(obj, (tuple, list)):
        return sum(nbytes(v) for v in obj)
    return 0


def get(key, device: torch.device, make):
    """``make()``'s buffers for ``key`` on ``device``, kept and reused as the module docstring says."""
    if device.type == "cuda":
        if torch.cuda.is_current_stream_capturing():
            return make()
        stream = torch.cuda.current_stream(device).cuda_stream
    else:
        stream = 0
    k = (key, device, stream, threading.get_ident())
    ws = _kept.get(k)
    if ws is not None:
        _kept.move_to_end(k)
        return ws
    ws = make()
    if nbytes(ws) <= MAX_BYTES:
        _kept[k] = ws
        while len(_kept) > MAX_ENTRIES:
            _kept.popitem(last=False)
    return ws


def clear() -> None:
    """Drop every kept workspace (their memory returns to torch's caching allocator)."""
    _kept.clear()
