"""Microbenchmark kernels for ``megamoe calibrate`` (the cost model's numbers, never the MoE kernels).

Shape legend: P programs, S SMs, R rounds, N rows, H row width, BM/BN/BK tile sizes.

Each kernel isolates one mechanism ``simulator/cost.py`` prices (see docs/calibration.md). The
launchers check the result against torch with ``check=True`` (the interpreter tests); only
``megamoe calibrate`` times them. The spin kernels need every program resident.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


# --------------------------------------------------------------------------- kernels
@triton.jit(do_not_specialize=["n_iters", "offset"])
def _stream_read_kernel(x_ptr, out_ptr, n_iters, offset, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    base = offset + pid.to(tl.int64) * n_iters * BLOCK
    acc = tl.zeros((BLOCK,), tl.float32)
    for i in range(n_iters):
        acc += tl.load(x_ptr + base + i * BLOCK + tl.arange(0, BLOCK), cache_modifier=".cg").to(tl.float32)
    tl.store(out_ptr + pid, tl.sum(acc, axis=0))


@triton.jit(do_not_specialize=["k_tiles"])
def _stream_tile_kernel(w_ptr, a_ptr, out_ptr, k_tiles, k_wrap, p_wrap,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Program p streams BLOCK_N K-contiguous weight rows of k_wrap x BLOCK_K values (those of
    program p mod p_wrap) through the GEMM load + dot loop against a small A, k_tiles K steps
    (cycling k_wrap): HBM read rate without a wrap, L2 rate with one that fits in L2."""
    pid = tl.program_id(0)
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    kd = k_wrap * BLOCK_K
    w = w_ptr + (pid % p_wrap).to(tl.int64) * BLOCK_N * kd + offs_n[None, :].to(tl.int64) * kd + offs_k[:, None]
    a = tl.load(a_ptr + offs_m[:, None] * BLOCK_K + offs_k[None, :])
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for kt in range(k_tiles):
        acc = tl.dot(a, tl.load(w + (kt % k_wrap) * BLOCK_K), acc)
    tl.store(out_ptr + pid.to(tl.int64) * BLOCK_M * BLOCK_N + offs_m[:, None] * BLOCK_N + offs_n[None, :], acc)


@triton.jit(do_not_specialize=["steps"])
def _mma_resident_kernel(a_ptr, b_ptr, c_ptr, steps, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                         BLOCK_K: tl.constexpr):
    """c[pid] = steps x (a (BM, BK) @ b (BK, BN)): the operands are loaded once and the loop only
    multiplies, so the time is the tensor cores' (no L2 or HBM traffic in the loop)."""
    pid = tl.program_id(0)
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a = tl.load(a_ptr + offs_m[:, None] * BLOCK_K + offs_k[None, :])
    b = tl.load(b_ptr + offs_k[:, None] * BLOCK_N + offs_n[None, :])
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for _ in range(steps):
        acc = tl.dot(a, b, acc)
    tl.store(c_ptr + pid.to(tl.int64) * BLOCK_M * BLOCK_N + offs_m[:, None] * BLOCK_N + offs_n[None, :],
             acc.to(c_ptr.dtype.element_ty))


@triton.jit(do_not_specialize=["depth", "pairs"])
def _mma_kernel(a_ptr, b_ptr, c_ptr, depth, pairs, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_K: tl.constexpr):
    """c[pid] = a[q] (BM, depth) @ b[q] (depth, BN), q = pid mod pairs: L2-resident operands, spread
    over ``pairs`` copies so that the programs do not all read the same lines."""
    pid = tl.program_id(0)
    q = (pid % pairs).to(tl.int64)
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptr += q * BLOCK_M * depth
    b_ptr += q * BLOCK_N * depth
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for k0 in range(0, depth, BLOCK_K):
        a = tl.load(a_ptr + offs_m[:, None] * depth + (k0 + offs_k)[None, :])
        b = tl.load(b_ptr + (k0 + offs_k)[:, None] * BLOCK_N + offs_n[None, :])
        acc = tl.dot(a, b, acc)
    tl.store(c_ptr + pid.to(tl.int64) * BLOCK_M * BLOCK_N + offs_m[:, None] * BLOCK_N + offs_n[None, :],
             acc.to(c_ptr.dtype.element_ty))


@triton.jit
def _empty_kernel(x_ptr):
    pass


@triton.jit(do_not_specialize=["rounds", "num_programs"])
def _handoff_kernel(counter_ptr, log_ptr, rounds, num_programs):
    """Round r belongs to program r mod P: it waits until the counter reads r, logs r, adds 1."""
    pid = tl.program_id(0)
    for r in range(pid, rounds, num_programs):
        v = tl.atomic_add(counter_ptr, 0, sem="acquire")
        while v < r:
            v = tl.atomic_add(counter_ptr, 0, sem="acquire")
        tl.store(log_ptr + r, pid)
        tl.debug_barrier()
        tl.atomic_add(counter_ptr, 1, sem="release")


@triton.jit(do_not_specialize=["rounds", "num_programs"])
def _barrier_kernel(counter_ptr, seen_ptr, rounds, num_programs):
    """R grid-wide barriers on one counter; program p records what it read after each one."""
    pid = tl.program_id(0)
    for r in range(rounds):
        tl.debug_barrier()
        tl.atomic_add(counter_ptr, 1, sem="release")
        target = (r + 1) * num_programs
        v = tl.atomic_add(counter_ptr, 0, sem="acquire")
        while v < target:
            v = tl.atomic_add(counter_ptr, 0, sem="acquire")
        tl.store(seen_ptr + pid * rounds + r, v)


@triton.jit(do_not_specialize=["num_tickets"])
def _ticket_kernel(ticket_ptr, owner_ptr, num_tickets):
    pid = tl.program_id(0)
    t = tl.atomic_add(ticket_ptr, 1)
    while t < num_tickets:
        tl.store(owner_ptr + t, pid)
        t = tl.atomic_add(ticket_ptr, 1)


@triton.jit(do_not_specialize=["num_rows", "H"])
def _gather_copy_kernel(src_ptr, idx_ptr, dst_ptr, num_rows, H, BLOCK_H: tl.constexpr):
    """Program p copies rows p, p + P, ...: dst[r] = src[idx[r]] (H values each)."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    for r in range(pid, num_rows, nprog):
        s = tl.load(idx_ptr + r).to(tl.int64)
        for h0 in range(0, H, BLOCK_H):
            offs = h0 + tl.arange(0, BLOCK_H)
            m = offs < H
            v = tl.load(src_ptr + s * H + offs, mask=m)
            tl.store(dst_ptr + tl.cast(r, tl.int64) * H + offs, v, mask=m)


@triton.jit(do_not_specialize=["steps"])
def _serial_load_kernel(x_ptr, w_ptr, out_ptr, steps, BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr,
                        BLOCK_E: tl.constexpr):
    """One program: acc += x[:, step] (BT, BH) @ w[step] (BH, BE) for ``steps`` steps (the router's loop)."""
    offs_t = tl.arange(0, BLOCK_T)
    offs_h = tl.arange(0, BLOCK_H)
    offs_e = tl.arange(0, BLOCK_E)
    acc = tl.zeros((BLOCK_T, BLOCK_E), tl.float32)
    width = steps * BLOCK_H
    for s in range(steps):
        xt = tl.load(x_ptr + offs_t[:, None] * width + (s * BLOCK_H + offs_h)[None, :])
        wt = tl.load(w_ptr + (s * BLOCK_H + offs_h)[:, None] * BLOCK_E + offs_e[None, :])
        acc = tl.dot(xt, wt, acc)
    tl.store(out_ptr + offs_t[:, None] * BLOCK_E + offs_e[None, :], acc)


@triton.jit
def _reduce_passes(v, steps, BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr):
    """``steps`` dependent passes of (row max, lowest column holding it) over v (BLOCK_T, BLOCK_E),
    each masking the column it found (a top-k's passes); -> the picked columns' sum per row."""
    cols = tl.arange(0, BLOCK_E)[None, :]
    picked = tl.zeros((BLOCK_T,), tl.int32)
    for _ in range(steps):
        m = tl.max(v, axis=1)
        i = tl.min(tl.where(v == m[:, None], cols, BLOCK_E), axis=1)
        picked += i
        v = tl.where(cols == i[:, None], float("-inf"), v)
    return picked


@triton.jit(do_not_specialize=["steps"])
def _serial_reduce_kernel(v_ptr, out_ptr, steps, BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr):
    """One program: ``steps`` dependent passes of a top-k's selection (_reduce_passes)."""
    offs_t = tl.arange(0, BLOCK_T)
    v = tl.load(v_ptr + offs_t[:, None] * BLOCK_E + tl.arange(0, BLOCK_E)[None, :])
    tl.store(out_ptr + offs_t, _reduce_passes(v, steps, BLOCK_T, BLOCK_E))


# --------------------------------------------------------------------------- launchers (with checks)
def _check(ok: bool, what: str) -> None:
    if not ok:
        raise AssertionError(f"microbench {what}: result disagrees with torch")


def _k_steps(nbytes: int, step: int, what: str = "", name: str = "bytes_per_program") -> int:
    """nbytes // step; ValueError unless ``nbytes`` is a positive multiple of ``step`` (``what``: its make-up)."""
    n = nbytes // step
    if n < 1 or n * step != nbytes:
        raise ValueError(f"{name}={nbytes} must be a positive multiple of {step}" + (f" ({what})" if what else ""))
    return n


def stream_read(x: torch.Tensor, programs: int, elems_per_program: int, *, block: int = 1024, offset: int = 0,
                num_warps: int = 4, check: bool = False) -> torch.Tensor:
    """Each of ``programs`` programs sums ``elems_per_program`` (a multiple of ``block``) values of x
    from ``offset`` on -> (programs,) fp32 partial sums."""
    n_iters = elems_per_program // block
    if n_iters < 1 or n_iters * block != elems_per_program:
        raise ValueError(f"elems_per_program={elems_per_program} must be a positive multiple of block={block}")
    if offset + programs * elems_per_program > x.numel():
        raise ValueError("stream_read reads past the end of x")
    out = torch.empty(programs, device=x.device, dtype=torch.float32)
    _stream_read_kernel[(programs,)](x, out, n_iters, offset, BLOCK=block, num_warps=num_warps)
    if check:
        want = x[offset:offset + programs * elems_per_program].view(programs, -1).float().sum(dim=1)
        _check(torch.allclose(out, want, rtol=1e-4, atol=1e-2), "stream_read")
    return out


def stream_tile(w: torch.Tensor, programs: int, bytes_per_program: int, *, block_n: int = 64, block_k: int = 128,
                block_m: int = 16, num_warps: int = 4, num_stages: int = 4, check: bool = False,
                wrap_bytes: int | None = None, wrap_programs: int | None = None) -> torch.Tensor:
    """``programs`` programs each stream ``bytes_per_program`` of w (flat) as block_n K-contiguous
    rows through load + dot -> (programs, BM, BN) fp32. ``wrap_bytes`` / ``wrap_programs``: program
    p rereads the wrap_bytes region of program p mod wrap_programs."""
    what = "stream_tile"
    tile = block_n * block_k * w.element_size()
    k_tiles = _k_steps(bytes_per_program, tile, f"block_n x block_k x {w.element_size()} bytes")
    k_wrap = k_tiles if wrap_bytes is None else _k_steps(wrap_bytes, tile, name="wrap_bytes")
    p_wrap = programs if wrap_programs is None else int(wrap_programs)
    if p_wrap < 1:
        raise ValueError(f"wrap_programs must be >= 1, got {wrap_programs}")
    if min(programs, p_wrap) * k_wrap * tile > w.numel() * w.element_size():
        raise ValueError(f"{what} reads past the end of w")
    kd = k_wrap * block_k  # values per weight row
    regions = min(programs, p_wrap)
    a = torch.ones((block_m, block_k), device=w.device, dtype=w.dtype)
    out = torch.empty((programs, block_m, block_n), device=w.device, dtype=torch.float32)
    _stream_tile_kernel[(programs,)](w, a, out, k_tiles, k_wrap, p_wrap, BLOCK_M=block_m, BLOCK_N=block_n,
                                     BLOCK_K=block_k, num_warps=num_warps, num_stages=num_stages)
    if check:  # program p's row sums: its region's K tiles kt mod k_wrap for kt < k_tiles
        reg = w.reshape(-1)[:regions * block_n * kd].view(-1, block_n, k_wrap, block_k).float()
        times = torch.tensor([(k_tiles - i + k_wrap - 1) // k_wrap for i in range(k_wrap)], device=w.device)
        rows_sum = (reg.sum(dim=3) * times).sum(dim=2)[torch.arange(programs, device=w.device) % regions]
        _check(torch.allclose(out, rows_sum[:, None, :].expand_as(out), rtol=1e-3, atol=1e-2), what)
    return out


def mma(a: torch.Tensor, b: torch.Tensor, programs: int, *, block_k: int, num_warps: int = 4, num_stages: int = 3,
        check: bool = False, out: torch.Tensor | None = None):
    """a[q] (BM, depth) @ b[q] (depth, BN) per program, q = program mod Q, for a (Q, BM, depth) and
    b (Q, depth, BN) (2-D: Q = 1) -> ((programs, BM, BN), compiled kernel)."""
    a3, b3 = (a[None], b[None]) if a.dim() == 2 else (a, b)
    pairs, BM, depth = a3.shape
    BN = b3.shape[2]
    if depth % block_k:
        raise ValueError(f"depth={depth} must be a multiple of block_k={block_k}")
    c = out if out is not None else torch.empty((programs, BM, BN), device=a.device, dtype=a.dtype)
    k = _mma_kernel[(programs,)](a3.contiguous(), b3.contiguous(), c, depth, pairs, BLOCK_M=BM, BLOCK_N=BN,
                                 BLOCK_K=block_k, num_warps=num_warps, num_stages=num_stages)
    if check:
        want = (a3.float() @ b3.float()).to(a.dtype)
        _check(all(torch.allclose(c[p].float(), want[p % pairs].float(), rtol=2e-2, atol=2e-2)
                   for p in range(programs)), "mma")
    return c, k


def mma_resident(a: torch.Tensor, b: torch.Tensor, programs: int, steps: int, *, num_warps: int = 4,
                 check: bool = False, out: torch.Tensor | None = None):
    """``steps`` x a (BM, BK) @ b (BK, BN) per program, operands on chip -> ((programs, BM, BN),
    compiled kernel). float8_e4m3fn a and b give fp32 c (unless ``out``); else c in a's dtype."""
    BM, BK = a.shape
    BN = b.shape[1]
    fp8 = a.dtype == torch.float8_e4m3fn
    if fp8 != (b.dtype == torch.float8_e4m3fn):
        raise ValueError(f"mma_resident takes two float8_e4m3fn operands or none, got {a.dtype} and {b.dtype}")
    c = out if out is not None else torch.empty((programs, BM, BN), device=a.device,
                                                dtype=torch.float32 if fp8 else a.dtype)
    k = _mma_resident_kernel[(programs,)](a, b, c, steps, BLOCK_M=BM, BLOCK_N=BN, BLOCK_K=BK, num_warps=num_warps)
    if check:
        want = (steps * (a.float() @ b.float())).to(c.dtype)
        _check(all(torch.allclose(c[p].float(), want.float(), rtol=2e-2, atol=2e-2) for p in range(programs)),
               "mma_resident")
    return c, k


def empty(x: torch.Tensor) -> None:
    _empty_kernel[(1,)](x, num_warps=1)


def handoff(rounds: int, programs: int, device, *, check: bool = False) -> torch.Tensor:
    """A token passed ``rounds`` times over ``programs`` programs -> log (rounds,) int32 of the
    program that held round r (r mod P)."""
    counter = torch.zeros(1, device=device, dtype=torch.int32)
    log = torch.full((rounds,), -1, device=device, dtype=torch.int32)
    _handoff_kernel[(programs,)](counter, log, rounds, programs, num_warps=1)
    if check:
        want = torch.arange(rounds, device=device, dtype=torch.int32) % programs
        _check(bool(torch.equal(log, want)) and int(counter.item()) == rounds, "handoff")
    return log


def barrier(rounds: int, programs: int, device, *, check: bool = False) -> torch.Tensor:
    """``rounds`` grid barriers of ``programs`` programs -> seen (P, R) int32: the counter each read."""
    counter = torch.zeros(1, device=device, dtype=torch.int32)
    seen = torch.zeros((programs, rounds), device=device, dtype=torch.int32)
    _barrier_kernel[(programs,)](counter, seen, rounds, programs, num_warps=1)
    if check:
        lo = (torch.arange(rounds, device=device, dtype=torch.int32) + 1) * programs
        _check(bool((seen >= lo).all()) and int(counter.item()) == rounds * programs, "barrier")
    return seen


def tickets(num_tickets: int, programs: int, device, *, check: bool = False) -> torch.Tensor:
    """``programs`` programs take ``num_tickets`` tickets -> owner (num_tickets,) int32."""
    ticket = torch.zeros(1, device=device, dtype=torch.int32)
    owner = torch.full((num_tickets,), -1, device=device, dtype=torch.int32)
    _ticket_kernel[(programs,)](ticket, owner, num_tickets, num_warps=1)
    if check:
        _check(bool((owner >= 0).all() and (owner < programs).all()), "tickets")
    return owner


def gather_copy(src: torch.Tensor, idx: torch.Tensor, programs: int, *, block_h: int = 1024, num_warps: int = 4,
                out: torch.Tensor | None = None, check: bool = False) -> torch.Tensor:
    """dst (N, H) = src[idx] copied by ``programs`` programs (one per copying SM)."""
    N, H = idx.numel(), src.shape[1]
    dst = out if out is not None else torch.empty((N, H), device=src.device, dtype=src.dtype)
    _gather_copy_kernel[(programs,)](src, idx, dst, N, H, BLOCK_H=block_h, num_warps=num_warps)
    if check:
        _check(bool(torch.equal(dst, src[idx.long()])), "gather_copy")
    return dst


def serial_load(x: torch.Tensor, w: torch.Tensor, steps: int, *, block_h: int, check: bool = False) -> torch.Tensor:
    """One program: x (BT, steps*BH) @ w (steps*BH, BE) in ``steps`` dependent steps -> (BT, BE) fp32."""
    BT, BE = x.shape[0], w.shape[1]
    out = torch.empty((BT, BE), device=x.device, dtype=torch.float32)
    _serial_load_kernel[(1,)](x, w, out, steps, BLOCK_T=BT, BLOCK_H=block_h, BLOCK_E=BE, num_warps=4)
    if check:
        _check(torch.allclose(out, x.float() @ w.float(), rtol=2e-2, atol=2e-2), "serial_load")
    return out


def serial_reduce(v: torch.Tensor, steps: int, *, check: bool = False) -> torch.Tensor:
    """One program: ``steps`` top-1 passes over the rows of v (BT, BE) fp32 -> (BT,) sum of the picked columns."""
    BT, BE = v.shape
    out = torch.empty(BT, device=v.device, dtype=torch.int32)
    _serial_reduce_kernel[(1,)](v, out, steps, BLOCK_T=BT, BLOCK_E=BE, num_warps=4)
    if check:
        k = min(steps, BE)
        want = torch.topk(v, k, dim=1).indices.sum(dim=1).to(torch.int32)
        _check(bool(torch.equal(out, want)) if steps <= BE else True, "serial_reduce")
    return out
