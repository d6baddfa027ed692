"""The kernels' input checks: the weights against the config (``check_weights``, once per binding)
and the routing of ``moe_experts`` (a routing made elsewhere, made safe on the device).

Shape legend: T tokens, E experts, K top-k (slots per token), H hidden, I expert width.

``check_weights(weights, config, device, dtype)`` raises ``KernelInputError`` naming the tensor and
its expected shape, dtype, device or layout, and FP8 block scales not finite and > 0. Scale values
are read once per scale tensor, never inside a CUDA-graph capture or under torch.compile.

``_check_kernel`` makes a routing from outside safe for the align kernels: ids (T, K) int32 with
every bad slot (out of [0, E), a -1 included, or a duplicate: the earlier slot is kept) replaced by
the lowest expert not in the token's row, weights (T, K) fp32 with 0 in bad and non-finite slots,
and a flag (6,) int64: per kind the first bad slot as (t * K + k) << 32 | value's low 32 bits
(atomic min), then each kind's count. Bad slots always contribute 0 to the output.

When a bad routing is reported (``moe_experts(check=True)``):
- CPU (interpreter): at once, by the call itself (everything there is synchronous).
- CUDA, outside a capture: never by a host wait. The call takes a check slot (``call_flag``: a
  flag on the device, a row of pinned host memory, a CUDA event, all made ahead in groups of
  SLOT_GROUP and reused: CUDA counts a page-locked allocation among the operations that
  synchronize implicitly), clears its flag by one copy, and after the check enqueues an
  asynchronous copy of the flag to the slot's pinned row and records the slot's event
  (``defer``). The next megamoe call on that device (``moe_experts``, ``moe_forward``, a ``bind``
  closure) polls the events that have completed (``event.query()``, no wait) and raises for the
  first flagged call; ``check_routing(device)`` waits for every pending check and raises likewise.
  The error then names the earlier call's token, slot and value. A slot returns to the device's
  free list once its flag has been read.
- Inside a capture, under torch.compile or with ``check=False``: recorded in a sticky per-device
  flag that ``check_captured_routing(device)`` reads, raises on and clears.
"""

from __future__ import annotations

import weakref
from collections import deque

import torch
import triton
import triton.language as tl

from ..reference import InputError
from ..reference.config import MoEConfig
from ..reference.weights import SCALE_FIELDS, MoEWeights
from .align import _block_counts, _finish_offsets, _scatter_block
from .jit_keys import settle
from .plan import align_blocks


class KernelInputError(ValueError):
    """An input of the fused MoE layer is unusable; the message says which and why."""


_scales_ok: dict[int, tuple[weakref.ref, int]] = {}  # id(scale tensor) -> (the tensor, its _version), checked


def check_weights(weights, config, device: torch.device, dtype: torch.dtype) -> None:
    """Raise ``KernelInputError`` unless ``weights`` (``MoEWeights.to_torch``) fit ``config``, ``device``
    and ``dtype`` (module docstring)."""
    if not isinstance(config, MoEConfig):
        raise KernelInputError(f"config must be a MoEConfig, got {type(config).__name__}")
    if not isinstance(weights, MoEWeights):
        raise KernelInputError(f"weights must be a MoEWeights (MoEWeights.to_torch(...)), got {type(weights).__name__}")
    try:  # presence and shapes: the reference's own check of the canonical layout
        weights.validate(config)
    except InputError as exc:
        raise KernelInputError(f"{exc} (config {config.describe()})") from None
    fp8 = set(SCALE_FIELDS.values()) if weights.is_fp8 else set()
    for name, t in weights.arrays().items():
        if not isinstance(t, torch.Tensor):
            raise KernelInputError(f"weights.{name} must be a torch.Tensor (MoEWeights.to_torch), got {type(t).__name__}")
        if t.device != device:
            raise KernelInputError(f"weights.{name} is on {t.device}, x on {device}: both must be on one device")
        if name in SCALE_FIELDS or name in fp8:
            want = torch.float32 if name in SCALE_FIELDS else torch.float8_e4m3fn
            if t.dtype != want:
                why = ("FP8 block scales are float32" if name in SCALE_FIELDS else
                       "FP8 expert weights are float8_e4m3fn (MoEWeights.to_torch keeps them so)")
                raise KernelInputError(f"weights.{name} has dtype {t.dtype}, expected {want}: {why}")
        elif t.dtype != dtype:
            raise KernelInputError(f"weights.{name} has dtype {t.dtype}, x has {dtype}: they must agree")
        if not t.is_contiguous():
            raise KernelInputError(f"weights.{name} must be contiguous, got strides {list(t.stride())}")
    if weights.is_fp8 and not torch.compiler.is_compiling() and not capturing(device):
        for name in SCALE_FIELDS:
            if getattr(weights, name) is not None:
                _check_scale_values(f"weights.{name}", getattr(weights, name))


def _check_scale_values(name: str, s: torch.Tensor) -> None:
    """FP8 scales finite and > 0 (reference.fp8.check_scales), read once per tensor and version."""
    seen = _scales_ok.get(id(s))
    if seen is not None and seen[0]() is s and seen[1] == s._version:
        return
    bad = ~(torch.isfinite(s) & (s > 0))
    if bool(bad.any()):
        i = tuple(int(j) for j in bad.nonzero()[0].tolist())
        raise KernelInputError(f"{name} (shape {list(s.shape)}) must be finite and > 0, got {s[i].item()} at index {i}")
    key = id(s)
    _scales_ok[key] = (weakref.ref(s, lambda _: _scales_ok.pop(key, None)), s._version)


KINDS = ("out_of_range", "duplicate", "non_finite_weight")
_NONE = 2**63 - 1  # no bad slot of this kind yet
#: the most tokens whose check and align run as one program (launch_check_align)
CHECK_ALIGN_MAX_T = 16
_OFFSET = 2**31  # values are stored as value + 2^31 in the low 32 bits
_flags: dict[tuple[str, bool], torch.Tensor] = {}  # (device, captured) -> flag (6,) int64


@triton.jit
def _col(a, offs_k, k):
    """Column k of a (BLOCK_T, BLOCK_K) tensor, as (BLOCK_T,)."""
    return tl.sum(tl.where(offs_k[None, :] == k, a, 0), axis=1)


@triton.jit
def _record(flag_ptr, kind, bad, key, NONE: tl.constexpr):
    """Atomic min of the keys of this program's bad slots into flag[kind], add their count."""
    first = tl.min(tl.min(tl.where(bad, key, NONE), axis=1), axis=0)
    n = tl.sum(tl.sum(bad.to(tl.int64), axis=1), axis=0)
    tl.atomic_min(flag_ptr + kind, first, mask=n > 0)
    tl.atomic_add(flag_ptr + 3 + kind, n, mask=n > 0)


@triton.jit
def _free_experts(ids, good, offs_k, offs_e, E, K: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr):
    """ids with each bad slot replaced: the experts its token's good slots hold are taken, then the
    bad slots take the lowest free ones in slot order (a distinct expert per slot, weight 0)."""
    used = tl.zeros((BLOCK_T, BLOCK_E), tl.int32)
    for k in tl.static_range(K):
        gk = _col(good.to(tl.int32), offs_k, k) > 0
        used = used | tl.where((offs_e[None, :] == _col(ids, offs_k, k)[:, None]) & gk[:, None], 1, 0)
    out = ids
    for k in tl.static_range(K):
        gk = _col(good.to(tl.int32), offs_k, k) > 0
        free = tl.min(tl.where((used == 0) & (offs_e[None, :] < E), offs_e[None, :], BLOCK_E), axis=1)
        out = tl.where((offs_k[None, :] == k) & ~gk[:, None], free.to(tl.int64)[:, None], out)
        used = used | tl.where((offs_e[None, :] == free[:, None]) & ~gk[:, None], 1, 0)
    return out


@triton.jit
def _check_block(idx_ptr, w_ptr, idx_out_ptr, w_out_ptr, flag_ptr, pid, T, E, K: tl.constexpr,
                 BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_E: tl.constexpr, NONE: tl.constexpr):
    """Token block pid of a routing given, checked: stores its safe ids (int32; a bad slot on a free
    expert) and weights (fp32; 0 for a bad slot) and records its bad slots into flag_ptr ->
    (safe ids (BLOCK_T, BLOCK_K) int32, slot mask, offs_t, offs_e)."""
    offs_t = pid * BLOCK_T + tl.arange(0, BLOCK_T)
    offs_k = tl.arange(0, BLOCK_K)
    offs_e = tl.arange(0, BLOCK_E)
    m = (offs_t < T)[:, None] & (offs_k[None, :] < K)
    pair = offs_t.to(tl.int64)[:, None] * K + offs_k[None, :]
    ids = tl.load(idx_ptr + pair, mask=m, other=0).to(tl.int64)
    w = tl.load(w_ptr + pair, mask=m, other=0.0).to(tl.float32)
    in_range = (ids >= 0) & (ids < E)
    dups = tl.zeros((BLOCK_T, BLOCK_K), tl.int32)
    for j in tl.static_range(K):
        dups += tl.where((ids == _col(ids, offs_k, j)[:, None]) & (offs_k[None, :] > j), 1, 0)
    dup = dups > 0
    good = in_range & ~dup & m
    finite = tl.abs(w) <= 3.4028234663852886e38  # False for NaN and inf
    out = ids
    if tl.sum(tl.sum((m & ~good).to(tl.int32), axis=1), axis=0) > 0:  # (rare) bad ids: placed on free experts
        out = _free_experts(ids, good, offs_k, offs_e, E, K, BLOCK_T, BLOCK_E)
    out = out.to(tl.int32)
    tl.store(idx_out_ptr + pair, out, mask=m)
    tl.store(w_out_ptr + pair, tl.where(good & finite, w, 0.0), mask=m)
    # error record: (pair << 32) | (value + 2^31), the value clamped to int32 / the weight's bits
    shift = tl.full((BLOCK_T, BLOCK_K), 4294967296, tl.int64)
    off = tl.full((BLOCK_T, BLOCK_K), 2147483648, tl.int64)
    v = tl.minimum(tl.maximum(ids, -2147483648), 2147483647)
    _record(flag_ptr, 0, m & ~in_range, pair * shift + v + off, NONE)
    _record(flag_ptr, 1, m & in_range & dup, pair * shift + v + off, NONE)
    wbits = w.to(tl.int32, bitcast=True).to(tl.int64)
    _record(flag_ptr, 2, m & ~finite, pair * shift + wbits + off, NONE)
    return out, m, offs_t, offs_e


@triton.jit(do_not_specialize=["T"])
def _check_kernel(idx_ptr, w_ptr, idx_out_ptr, w_out_ptr, flag_ptr, T, E,
                  K: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_E: tl.constexpr,
                  NONE: tl.constexpr):
    _check_block(idx_ptr, w_ptr, idx_out_ptr, w_out_ptr, flag_ptr, tl.program_id(0), T, E, K, BLOCK_T, BLOCK_K,
                 BLOCK_E, NONE)


@triton.jit(do_not_specialize=["T"])
def _check_align_kernel(idx_ptr, w_ptr, idx_out_ptr, w_out_ptr, flag_ptr, counts_ptr, padded_off_ptr,
                        block_expert_ptr, padded_token_ptr, padded_pair_ptr, pair_dest_ptr, T, E, B_MAX,
                        K: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_E: tl.constexpr,
                        NONE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_PAD: tl.constexpr):
    """Every token in one program: the check, then the align of its safe ids (what the router's
    fused align stores: align._finish_offsets and align._scatter_block), in one launch."""
    ids, m, offs_t, offs_e = _check_block(idx_ptr, w_ptr, idx_out_ptr, w_out_ptr, flag_ptr, 0, T, E, K, BLOCK_T,
                                          BLOCK_K, BLOCK_E, NONE)
    ids = tl.where(m, ids, -1)
    t_mask = offs_t < T
    counts = _block_counts(ids, t_mask, tl.arange(0, BLOCK_K), offs_e, K, BLOCK_T, BLOCK_E, BLOCK_K)
    start = _finish_offsets(counts, offs_e, offs_e < E, E, B_MAX, counts_ptr, padded_off_ptr, block_expert_ptr,
                            padded_token_ptr, padded_pair_ptr, BLOCK_M, BLOCK_E, BLOCK_B, BLOCK_PAD)
    _scatter_block(ids, offs_t, t_mask, start, offs_e, padded_token_ptr, padded_pair_ptr, pair_dest_ptr, K,
                   BLOCK_T, BLOCK_E, BLOCK_K)


def _init(flag: torch.Tensor) -> torch.Tensor:
    flag[:3].fill_(_NONE)
    flag[3:].zero_()
    return flag


def new_flag(device) -> torch.Tensor:
    """A cleared flag (6,) int64 on ``device``."""
    return _init(torch.empty(6, dtype=torch.int64, device=device))


def flag_for(device, captured: bool) -> torch.Tensor:
    """The per-device flag: the eager one (reset per call) or the sticky one (captured graphs, unread
    calls), made on first use (make the first call outside capture)."""
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    key = (str(dev), bool(captured))
    if key not in _flags:  # both at once, so that a warm-up call makes the captured one too
        _flags[(str(dev), False)] = new_flag(dev)
        _flags[(str(dev), True)] = new_flag(dev)
    return _flags[key]


def capturing(where) -> bool:
    """Whether the current CUDA stream is being captured into a graph (False off CUDA); ``where``: a
    device, or a tensor on it (an eager call's x: no device object made)."""
    if isinstance(where, torch.Tensor):
        return where.is_cuda and torch.cuda.is_current_stream_capturing()
    return torch.device(where).type == "cuda" and torch.cuda.is_current_stream_capturing()


def launch_check_align(topk_idx: torch.Tensor, topk_weights: torch.Tensor, num_experts: int, flag: torch.Tensor,
                       out: tuple, meta: dict, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``launch_check``'s (ids, weights) into ``out``, and the align of those ids into ``meta``
    (moe.align_buffers' tensors but chunk_base), in one launch of one program: for T <=
    CHECK_ALIGN_MAX_T tokens (decode), where the check, histogram and three align launches would
    each cost a launch."""
    T, K = topk_idx.shape
    if not 1 <= T <= CHECK_ALIGN_MAX_T:
        raise ValueError(f"launch_check_align takes 1 to {CHECK_ALIGN_MAX_T} tokens, got T={T}")
    ids, w = out
    b_max = meta["block_expert"].shape[0]
    bl = align_blocks(num_experts, block_m, b_max)
    _check_align_kernel[(1,)](
        topk_idx, topk_weights, ids, w, flag, meta["counts"], meta["padded_offsets"], meta["block_expert"],
        meta["padded_token"], meta["padded_pair"], meta["pair_dest"], T, num_experts, b_max, K=K,
        BLOCK_T=max(2, triton.next_power_of_2(T)), BLOCK_K=max(2, triton.next_power_of_2(K)), BLOCK_E=bl["BLOCK_E"],
        NONE=_NONE, BLOCK_M=block_m, BLOCK_B=bl["BLOCK_B"], BLOCK_PAD=bl["BLOCK_PAD"], num_warps=4)
    return ids, w


def launch_check(topk_idx: torch.Tensor, topk_weights: torch.Tensor, num_experts: int,
                 flag: torch.Tensor, out: tuple | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids (T, K) int32, weights (T, K) fp32) sanitized from contiguous (T, K) ids and weights of any
    integer / float dtype; bad slots recorded into ``flag``. ``out``: those two buffers, made beforehand."""
    T, K = topk_idx.shape
    if out is not None:
        ids, w = out
    else:
        ids = torch.empty((T, K), device=topk_idx.device, dtype=torch.int32)
        w = torch.empty((T, K), device=topk_idx.device, dtype=torch.float32)
    if T == 0:
        return ids, w
    block_t = 16
    _check_kernel[(triton.cdiv(T, block_t),)](
        topk_idx, topk_weights, ids, w, flag, T, num_experts, K=K, BLOCK_T=block_t,
        BLOCK_K=max(2, triton.next_power_of_2(K)), BLOCK_E=max(16, triton.next_power_of_2(num_experts)),
        NONE=_NONE, num_warps=4)
    return ids, w


def describe_flag(flag: torch.Tensor, num_experts: int, top_k: int, topk_idx: torch.Tensor | None = None,
                  topk_weights: torch.Tensor | None = None) -> str | None:
    """The error message for a flag (None when it records nothing). Reads the flag to the host."""
    f = flag.tolist()
    counts = dict(zip(KINDS, f[3:]))
    firsts = [(key >> 32, kind) for key, kind in zip(f[:3], KINDS) if key != _NONE]
    if not firsts:
        return None
    pair, kind = min(firsts)
    key = f[KINDS.index(kind)]
    t, k = divmod(pair, top_k)
    low = (key & 0xFFFFFFFF) - _OFFSET
    if kind == "non_finite_weight":
        value = topk_weights[t, k].item() if topk_weights is not None else \
            torch.tensor([low], dtype=torch.int32).view(torch.float32).item()
    else:
        value = int(topk_idx[t, k].item()) if topk_idx is not None else low
    if kind == "out_of_range" and value == -1:
        what = (f"topk_idx[{t}, {k}] = -1 (token {t}, slot {k}): masked slots (-1) are not supported yet; "
                f"give the slot an expert the token does not use, with weight 0")
    elif kind == "out_of_range":
        what = f"topk_idx[{t}, {k}] = {value} (token {t}, slot {k}) is outside [0, {num_experts})"
    elif kind == "duplicate":
        row = topk_idx[t].tolist() if topk_idx is not None else None
        j = row.index(value) if row is not None else None
        where = f" (slots {j} and {k})" if j is not None else f" (slot {k})"
        what = (f"topk_idx[{t}, {k}] = {value}: token {t} names expert {value} twice{where}; "
                f"each token's K ids must be distinct")
    else:
        what = f"topk_weights[{t}, {k}] = {value} (token {t}, slot {k}) is not finite"
    n = sum(counts.values())
    more = f" ({n} bad slots in all: " + ", ".join(f"{c} {kd.replace('_', ' ')}" for kd, c in counts.items() if c) + ")"
    return what + (more if n > 1 else "")


def raise_if_flagged(flag: torch.Tensor, num_experts: int, top_k: int, topk_idx=None, topk_weights=None) -> None:
    msg = describe_flag(flag, num_experts, top_k, topk_idx, topk_weights)
    if msg:
        raise KernelInputError(msg)


class _Slot:
    """The buffers of one eager call's check, reused: its flag (6,) int64 on the device, the flag's
    pinned host copy and the CUDA event recorded after that copy."""

    __slots__ = ("flag", "host", "event")

    def __init__(self, flag: torch.Tensor, host: torch.Tensor, event):
        self.flag, self.host, self.event = flag, host, event


#: check slots made at once when a device has none free (one pinned allocation per group)
SLOT_GROUP = 64
_ROW = 8  # int64 per slot row: 64 bytes, so that every row's flag starts 16-byte aligned


class _Pending:
    """One checked eager call whose flag is on its way to the host: the event after its copy, the
    pinned copy, the sizes and the caller's routing tensors with their versions (for the message);
    ``slot``: the ``_Slot`` it returns to the free list once read (None: nothing to return)."""

    __slots__ = ("device", "event", "host", "num_experts", "top_k", "topk_idx", "topk_weights", "versions", "slot")

    def __init__(self, device: str, event, host, num_experts: int, top_k: int, topk_idx, topk_weights,
                 slot: _Slot | None = None):
        self.device, self.event, self.host, self.num_experts, self.top_k = device, event, host, num_experts, top_k
        self.topk_idx, self.topk_weights, self.slot = topk_idx, topk_weights, slot
        self.versions = (topk_idx._version, topk_weights._version)

    def message(self) -> str | None:
        same = (self.topk_idx._version, self.topk_weights._version) == self.versions
        idx, w = (self.topk_idx, self.topk_weights) if same else (None, None)
        msg = describe_flag(self.host, self.num_experts, self.top_k, idx, w)
        return None if msg is None else f"an earlier moe_experts call's routing on {self.device}: {msg}"


_pending: dict[str, deque] = {}  # device -> its eager calls' pending checks, oldest first
_templates: dict[str, torch.Tensor] = {}  # device -> a cleared flag, copied into each call's own
_free: dict[str, list[_Slot]] = {}  # device -> its check slots not in flight
_taken: dict[str, _Slot] = {}  # device -> the slot call_flag gave last, until defer enqueues its copy


def _device_key(device) -> str:
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return str(dev)


def _new_slots(key: str) -> list[_Slot]:
    flags = torch.empty((SLOT_GROUP, _ROW), dtype=torch.int64, device=key)
    host = torch.empty((SLOT_GROUP, _ROW), dtype=torch.int64, pin_memory=True)
    return [_Slot(flags[i, :6], host[i, :6], torch.cuda.Event()) for i in range(SLOT_GROUP)]


def call_flag(device) -> torch.Tensor:
    """A cleared flag of one eager call on ``device`` (a free check slot's, cleared by one copy from a
    kept template), made the device's eager flag (``flag_for(device, captured=False)``) until the
    next call's. ``defer`` takes it back with the slot."""
    key = _device_key(device)
    tpl = _templates.get(key)
    if tpl is None:
        tpl = _templates[key] = new_flag(key)
        flag_for(key, captured=True)  # the sticky one too, outside any capture
    free = _free.get(key)
    if not free:
        free = _free[key] = _new_slots(key)
    slot = free.pop()
    slot.flag.copy_(tpl, non_blocking=True)
    _flags[(key, False)] = slot.flag
    _taken[key] = slot  # a call that fails before defer drops its slot with the next call's
    return slot.flag


def defer(flag: torch.Tensor, num_experts: int, top_k: int, topk_idx: torch.Tensor,
          topk_weights: torch.Tensor) -> None:
    """Enqueue ``flag``'s copy to pinned host memory and an event after it, to be read without a
    wait by ``poll`` (module docstring). ``flag``: ``call_flag``'s (its slot's buffers are used),
    or any other (new ones made); ``topk_idx`` / ``topk_weights``: the caller's tensors."""
    key = _device_key(flag.device)
    slot = _taken.pop(key, None)
    if slot is not None and slot.flag is flag:
        host, event = slot.host, slot.event
    else:
        slot, host, event = None, torch.empty(flag.shape, dtype=flag.dtype, pin_memory=True), torch.cuda.Event()
    host.copy_(flag, non_blocking=True)
    event.record(torch.cuda.current_stream(flag.device))
    _pending.setdefault(key, deque()).append(_Pending(key, event, host, num_experts, top_k, topk_idx, topk_weights,
                                                      slot))


def _read(q: deque) -> str | None:
    """The message of q's oldest check (done), taken off q; its slot goes back to the free list."""
    p = q.popleft()
    msg = p.message()
    if p.slot is not None:
        _free.setdefault(p.device, []).append(p.slot)
    return msg


def poll(device) -> None:
    """Raise ``KernelInputError`` for the first pending check of ``device`` that is done and
    flagged; never waits (checks not done stay pending). Nothing while ``device`` is capturing."""
    q = _pending.get(_device_key(device))
    if not q or capturing(device):
        return
    while q and q[0].event.query():
        msg = _read(q)
        if msg:
            raise KernelInputError(msg)


def check_routing(device="cuda") -> None:
    """Wait for every pending routing check of ``moe_experts`` calls on ``device`` and raise
    ``KernelInputError`` for the first flagged one (module docstring; later ones stay pending).
    Nothing to do on the CPU, where a call raises at once. Call it outside a capture."""
    if torch.device(device).type != "cuda":
        return
    q = _pending.get(_device_key(device))
    while q:
        q[0].event.synchronize()
        msg = _read(q)
        if msg:
            raise KernelInputError(msg)


def check_captured_routing(device="cuda", *, num_experts: int, top_k: int, clear: bool = True) -> None:
    """Raise ``KernelInputError`` for the first bad slot the sticky flag recorded since the last
    clear (module docstring); call it outside capture; ``clear`` resets the flag."""
    key_dev = torch.device(device)
    flag = flag_for(key_dev, captured=True)
    try:
        raise_if_flagged(flag, num_experts, top_k)
    finally:
        if clear:
            _init(flag)


settle(globals())  # every JIT function's cache key, callees first (jit_keys.py)
