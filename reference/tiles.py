"""The megakernel's task plan: the ordered tasks one persistent launch runs for one MoE layer.

Shape legend: T tokens, E routed experts, K top-k, H hidden, I expert width, Is shared width,
KS = K (+1 with a shared MLP) rows per token in the pair buffer, C router chunks of BLOCK_T
tokens, B row blocks of BLOCK_M padded rows (plan_dispatch's blocks), N1 / N2 column tiles of
GEMM 1 / GEMM 2, P programs.

Tasks are taken in ticket order and a task waits only on counters that lower tickets signal, so
any number of programs finishes the layer. The task kinds, their waits and signals are tabled in
docs/megakernel.md. Router switches (``TILE_SWITCHES``): EACH, ALIGN_EACH. Every GEMM task is
one whole tile.

``task_plan(config, counts, T, tiles)`` returns the whole list as arrays (one entry per ticket)
with each task's tile, real rows, bytes, FLOPs and waits: kernels/megakernel.py runs this order and
the simulator's cost model reads it. NumPy only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from ._checks import InputError

KINDS = ("router_logits", "router_topk", "align_scan", "align_scatter", "shared_gemm1", "gemm1", "shared_gemm2",
         "gemm2", "combine")
KIND_CODE = {k: i for i, k in enumerate(KINDS)}

#: dependent global round trips of a routed GEMM task besides its ticket and its K loop
TASK_ROUND_TRIPS = {"gemm1": 4, "gemm2": 3}

#: the tile keys ``tiles`` must give, per part
TILE_KEYS = {
    "router": ("BLOCK_T", "BLOCK_H", "SPLIT"),
    "gemm1": ("BLOCK_M", "BLOCK_N", "BLOCK_K"),
    "gemm2": ("BLOCK_N", "BLOCK_K"),
    "shared": ("BLOCK_M", "BLOCK_N1", "BLOCK_N2", "BLOCK_K"),
    "combine": ("BLOCK_T", "BLOCK_H"),
    "order": ("GROUP_M",),
}

#: optional tile keys and their defaults: TOPK_T, tokens per top-k task (SPLIT > 1)
TILE_OPTIONAL = {"router": {"TOPK_T": "BLOCK_T"}}
#: optional switches (0 or 1) and their defaults: EACH (GEMM 1 tasks route the token themselves),
#: ALIGN_EACH (GEMM 1 tasks place their own row block's pairs: no scan and scatter tasks)
TILE_SWITCHES = {"router": {"EACH": 0, "ALIGN_EACH": 0}}
#: keys of layouts not planned (expert_slice tasks, stream-K segments): only 0, as stored configs carry them
RETIRED_KEYS = {"gemm1": "SLICE", "order": "STREAM_K"}
#: the most pairs T x K with ALIGN_EACH (one GEMM 1 task ranks them all in one vector: BLOCK_P lanes)
ALIGN_EACH_MAX_PAIRS = 1024

#: fixed words of the sync buffer, SYNC_STRIDE int32 words apart; then logits[C], g1[B_max], shared1[Ms]
SYNC_WORDS = ("ticket", "exited", "topk", "scan", "scatter", "g2")
SYNC_STRIDE = 32


class LoopForm(NamedTuple):
    """One GEMM_LOOP_FORMS form (see there)."""

    persistent: bool
    tma_w: bool
    tma_a: bool
    gated: bool
    flat: bool


#: the GEMM tile loops, each with its own profile table: name -> (persistent, weights through TMA,
#: rows through TMA, GEMM 1's gate and up accumulators, tile loop flattened into the K loop)
GEMM_LOOP_FORMS = {
    "pointer": LoopForm(False, False, False, False, False),
    "pointer_gated": LoopForm(False, False, False, True, False),
    "tma": LoopForm(False, True, False, False, False),
    "tma_persistent": LoopForm(True, True, False, False, False),
    "tma_persistent_gated": LoopForm(True, True, False, True, False),
    "tma_ab_persistent": LoopForm(True, True, True, False, False),
    "pointer_persistent": LoopForm(True, False, False, False, False),
    "pointer_persistent_gated": LoopForm(True, False, False, True, False),
    "tma_persistent_gated_flat": LoopForm(True, True, False, True, True),
    "tma_ab_persistent_flat": LoopForm(True, True, True, False, True),
}


def gemm_loop_form_text(name: str) -> str:
    """What a GEMM_LOOP_FORMS form is, in words (the calibrated profile's table sources)."""
    persistent, tma_w, tma_a, gated, flat = GEMM_LOOP_FORMS[name]
    loads = ("both through TMA descriptors" if tma_a else
             "weights through a TMA descriptor, rows by pointer loads" if tma_w else "both by pointer loads")
    return (f"{loads}, {'persistent programs (one per SM)' if persistent else 'a tile per program'}"
            + ("; gate and up accumulators (GEMM 1)" if gated else "")
            + ("; the tile walk flattened into the K loop" if flat else ""))


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def scan_block(groups: int) -> int:
    """Histogram rows the align scan reads per step (BLOCK_C, a power of two in [2, 16])."""
    return max(2, min(16, 1 << max(0, int(groups) - 1).bit_length()))


def check_tiles(tiles: dict) -> dict:
    """``tiles`` with every key of TILE_KEYS as a positive int; an error names the first bad one."""
    if not isinstance(tiles, dict):
        raise InputError(f"tiles must be a dict of parts {sorted(TILE_KEYS)}, got {type(tiles).__name__}")
    for part, keys in TILE_KEYS.items():
        sub = tiles.get(part)
        if not isinstance(sub, dict):
            raise InputError(f"tiles[{part!r}] must be a dict with keys {list(keys)}, got {sub!r}")
        for k in keys + tuple(TILE_OPTIONAL.get(part, {})):
            v = sub.get(k, sub.get(TILE_OPTIONAL.get(part, {}).get(k)))
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise InputError(f"tiles[{part!r}][{k!r}] must be a positive integer, got {v!r}")
    for part, keys in TILE_SWITCHES.items():
        for k in keys:
            v = tiles[part].get(k, 0)
            if isinstance(v, bool) or v not in (0, 1):
                raise InputError(f"tiles[{part!r}][{k!r}] must be 0 or 1, got {v!r}")
    for part, k in RETIRED_KEYS.items():
        if tiles[part].get(k, 0) != 0:
            raise InputError(f"tiles[{part!r}][{k!r}]={tiles[part][k]!r}: that layout is not planned; 0 or absent")
    r = tiles["router"]
    tt = r.get("TOPK_T", r["BLOCK_T"])
    if tt != r["BLOCK_T"] and (r["SPLIT"] <= 1 or r["BLOCK_T"] % tt) and not (r.get("EACH", 0) and tt == 1):
        raise InputError(f"tiles['router']['TOPK_T']={tt} must equal BLOCK_T={r['BLOCK_T']} unless SPLIT > 1 "
                         "and it divides BLOCK_T (the top-k task then sums the logits chunk's partials), or "
                         "it is 1 with EACH (one token)")
    return tiles


def topk_passes(config) -> int:
    """Dependent row reductions of one top-k selection: K, plus 2 + topk_group where n_group > 1."""
    return int(config.top_k) + (2 + int(config.topk_group) if config.n_group > 1 else 0)


def route_select_key(router: int, block_e: int, k: int, n_group: int, block_t: int, bitonic: int) -> tuple[float, ...]:
    """kernel_model.route_select's key of a routing program: (router, BLOCK_E, K, N_GROUP, BLOCK_T, BITONIC)
    with router = 1 + its index in ROUTERS and BITONIC = 1 + whether it takes the bitonic top-k."""
    return (float(router) + 1.0, float(block_e), float(k), float(n_group), float(block_t), 1.0 + bool(bitonic))


def topk_tokens(tiles: dict) -> int:
    """Tokens per top-k task (and per align chunk): TOPK_T, BLOCK_T where not given."""
    r = tiles["router"]
    return int(r.get("TOPK_T", r["BLOCK_T"]))


def topk_groups(T: int, H: int, tiles: dict) -> int:
    """G, the top-k tasks for T tokens: TOPK_T tokens each with a split router, else one per chunk."""
    r = tiles["router"]
    if router_ranges(H, r["SPLIT"], r["BLOCK_H"])[0] > 1:
        return cdiv(T, topk_tokens(tiles))
    return cdiv(T, r["BLOCK_T"])


def align_each_takes(T: int, H: int, K: int, tiles: dict) -> bool:
    """Whether ALIGN_EACH can apply: more than one top-k task, at most ALIGN_EACH_MAX_PAIRS pairs, not EACH."""
    return topk_groups(T, H, tiles) > 1 and T * K <= ALIGN_EACH_MAX_PAIRS and not tiles["router"].get("EACH", 0)


def router_ranges(H: int, split: int, block_h: int) -> tuple[int, int]:
    """(splits, H columns per split) of the decode router, whole BLOCK_H steps (split <= 1: all of H)."""
    if split <= 1:
        return 1, H
    h_per = cdiv(cdiv(H, split), block_h) * block_h
    return cdiv(H, h_per), h_per


def tile_ids(j: np.ndarray, num_m: int, num_n: int, group_m: int) -> tuple[np.ndarray, np.ndarray]:
    """Grouped tile order: task j -> (row block, N tile); GROUP_M row blocks sweep the N tiles together."""
    j = np.asarray(j, dtype=np.int64)
    width = group_m * num_n
    group = j // width
    first = group * group_m
    size = np.minimum(num_m - first, group_m)
    return first + (j % width) % size, (j % width) // size


@dataclass(frozen=True)
class TaskLayout:
    """The fixed part of the plan for T tokens (what the launcher passes to the kernel).

    first[kind] / count[kind] of the static kinds, S0 the first ticket after them; C, G, the
    router's split / h_per, Ms; the sync buffer's segments (off_logits, off_g1, off_shared1,
    sync_words); b_max; n1 / n2 N tiles and k1 / k2 K tiles per row block.
    """

    T: int
    num_chunks: int
    topk_groups: int
    split: int
    h_per: int
    first: dict
    count: dict
    s0: int
    b_max: int
    n1: int
    n2: int
    k1: int
    k2: int
    shared_m_blocks: int
    ns1: int
    ns2: int
    combine_tasks: int
    off_logits: int
    off_g1: int
    off_shared1: int
    sync_words: int
    #: GEMM 1 tasks route the token themselves (tiles["router"]["EACH"]; T <= 1: from a split router's
    #: logits, or from a routing given)
    route_each: bool = False
    #: GEMM 1 tasks place their own row block's pairs; no scan and scatter tasks (tiles["router"]["ALIGN_EACH"])
    align_each: bool = False
    #: tokens per top-k task: TOPK_T with a split router or EACH, else BLOCK_T
    topk_t: int = 1

    def dynamic_bases(self, num_blocks: int) -> dict:
        """First ticket of each kind after the static ones, for B = num_blocks routed row blocks."""
        g1 = self.s0
        sh2 = g1 + num_blocks * self.n1
        g2 = sh2 + self.shared_m_blocks * self.ns2
        comb = g2 + num_blocks * self.n2
        return {"gemm1": g1, "shared_gemm2": sh2, "gemm2": g2, "combine": comb,
                "end": comb + self.combine_tasks}

    @property
    def max_tasks(self) -> int:
        """The most tickets any routing can need (the kernel's MAX_TASKS)."""
        return self.dynamic_bases(self.b_max)["end"]


def max_row_blocks(num_pairs: int, num_experts: int, block_m: int) -> int:
    """The most row blocks of BLOCK_M any routing of num_pairs pairs over E experts can need."""
    if num_pairs == 0:
        return 0
    touched = min(num_experts, num_pairs)
    return cdiv(num_pairs + touched * (block_m - 1), block_m)


def task_layout(config, T: int, tiles: dict) -> TaskLayout:
    """The static part of the task plan for ``config`` (a MoEConfig) on T tokens."""
    check_tiles(tiles)
    if isinstance(T, bool) or not isinstance(T, (int, np.integer)) or T < 0:
        raise InputError(f"T must be a non-negative integer, got {T!r}")
    T = int(T)
    E, K, H, I = config.num_experts, config.top_k, config.hidden_size, config.intermediate_size
    r, g1, g2, sh, cb = tiles["router"], tiles["gemm1"], tiles["gemm2"], tiles["shared"], tiles["combine"]
    C = cdiv(T, r["BLOCK_T"])
    split, h_per = router_ranges(H, r["SPLIT"], r["BLOCK_H"])
    G = topk_groups(T, H, tiles)
    fused = G == 1
    align_each = bool(tiles["router"].get("ALIGN_EACH", 0))
    if align_each and not align_each_takes(T, H, config.top_k, tiles):
        raise InputError(f"tiles['router']['ALIGN_EACH']=1 (GEMM 1 tasks place their own rows) needs more than one "
                         f"top-k task, at most {ALIGN_EACH_MAX_PAIRS} pairs and no EACH: got T={T}, "
                         f"K={config.top_k}, {G} top-k tasks, EACH {int(bool(tiles['router'].get('EACH', 0)))}")
    count = {
        "router_logits": C * split if split > 1 else 0,
        "router_topk": G,
        "align_scan": 0 if fused or align_each else (1 if G else 0),
        "align_scatter": 0 if fused or align_each else G,
    }
    Is = config.shared_intermediate_size
    Ms = cdiv(T, sh["BLOCK_M"]) if Is else 0
    ns1 = cdiv(Is, sh["BLOCK_N1"]) if Is else 0
    ns2 = cdiv(H, sh["BLOCK_N2"]) if Is else 0
    count["shared_gemm1"] = Ms * ns1
    first, t = {}, 0
    for k in KINDS[:5]:
        first[k] = t
        t += count[k]
    b_max = max_row_blocks(T * K, E, g1["BLOCK_M"])
    off_logits = len(SYNC_WORDS) * SYNC_STRIDE
    off_g1 = off_logits + C
    off_shared1 = off_g1 + b_max
    n2 = cdiv(H, g2["BLOCK_N"])
    each = bool(tiles["router"].get("EACH", 0))
    if each and T > 1:
        raise InputError(f"tiles['router']['EACH']=1 (GEMM 1 tasks route the token themselves) needs one token: "
                         f"got T={T}")
    topk_t = topk_tokens(tiles) if split > 1 or each else r["BLOCK_T"]
    if each and topk_t != 1:
        raise InputError(f"tiles['router']['EACH']=1 needs top-k tasks of one token (TOPK_T = 1), got {topk_t}")
    return TaskLayout(
        T=T, num_chunks=C, topk_groups=G, split=split, h_per=h_per, first=first, count=count, s0=t, b_max=b_max,
        n1=cdiv(I, g1["BLOCK_N"]), n2=n2, k1=cdiv(H, g1["BLOCK_K"]), k2=cdiv(I, g2["BLOCK_K"]),
        shared_m_blocks=Ms, ns1=ns1, ns2=ns2,
        combine_tasks=cdiv(T, cb["BLOCK_T"]) * cdiv(H, cb["BLOCK_H"]) if T else 0,
        off_logits=off_logits, off_g1=off_g1, off_shared1=off_shared1,
        sync_words=off_shared1 + Ms, route_each=each, align_each=align_each, topk_t=topk_t,
    )


@dataclass(frozen=True)
class TaskPlan:
    """Every task of one launch, in ticket order (arrays of length n = num_tasks).

    kind (n,) int8 codes into KINDS; expert, block, n_tile, rows (real rows), tile_m / tile_n /
    depth (n,) int32; weight_bytes, in_bytes, out_bytes, flops (n,) float64 (FLOPs of the padded
    tile); weight_id (n,) int64 (same id, same weight slice; -1 none); signal_ptr (n+1,) /
    signal_counter and wait_ptr (n+1,) / wait_counter / wait_target: CSR lists; counters (names),
    counter_target (the value each reaches).
    """

    config_name: str
    num_tokens: int
    tiles: dict
    layout: TaskLayout
    counts: np.ndarray
    num_programs: int
    kind: np.ndarray
    expert: np.ndarray
    block: np.ndarray
    n_tile: np.ndarray
    rows: np.ndarray
    tile_m: np.ndarray
    tile_n: np.ndarray
    depth: np.ndarray
    weight_bytes: np.ndarray
    in_bytes: np.ndarray
    out_bytes: np.ndarray
    flops: np.ndarray
    weight_id: np.ndarray
    signal_ptr: np.ndarray
    signal_counter: np.ndarray
    wait_ptr: np.ndarray
    wait_counter: np.ndarray
    wait_target: np.ndarray
    counters: tuple = field(default_factory=tuple)
    counter_target: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    #: dependent row reductions of a top-k task's selection (topk_passes; 0: not given, K is used)
    topk_passes: int = 0

    @property
    def num_tasks(self) -> int:
        return int(self.kind.size)

    def tasks_per_kind(self) -> dict:
        """{kind: number of tasks} for every kind in KINDS (zeros included)."""
        n = np.bincount(self.kind.astype(np.int64), minlength=len(KINDS))
        return {k: int(n[i]) for i, k in enumerate(KINDS)}

    def tiles_per_expert(self, kind: str) -> np.ndarray:
        """(E,) tiles of ``kind`` (gemm1 or gemm2) per routed expert: row blocks x N tiles."""
        n = self.layout.n1 if kind == "gemm1" else self.layout.n2
        return -(-self.counts // self.tiles["gemm1"]["BLOCK_M"]) * n

    def waits(self, i: int) -> list[tuple[str, int]]:
        lo, hi = int(self.wait_ptr[i]), int(self.wait_ptr[i + 1])
        return [(self.counters[c], int(v)) for c, v in zip(self.wait_counter[lo:hi], self.wait_target[lo:hi])]

    def to_dict(self) -> dict:
        """Plain lists (JSON-ready) of every field: what a process without NumPy objects reads."""
        arrays = ("kind", "expert", "block", "n_tile", "rows", "tile_m", "tile_n", "depth", "weight_bytes",
                  "in_bytes", "out_bytes", "flops", "weight_id", "signal_ptr", "signal_counter", "wait_ptr",
                  "wait_counter", "wait_target", "counter_target", "counts")
        d = {a: getattr(self, a).tolist() for a in arrays}
        d.update(config_name=self.config_name, num_tokens=self.num_tokens, tiles=self.tiles,
                 num_programs=self.num_programs, kinds=list(KINDS), counters=list(self.counters))
        return d


class _Builder:
    """Appends groups of tasks (arrays) in ticket order; waits and signals as CSR lists."""

    COLS = ("kind", "expert", "block", "n_tile", "rows", "tile_m", "tile_n", "depth", "weight_bytes",
            "in_bytes", "out_bytes", "flops", "weight_id")

    def __init__(self):
        self.parts = {c: [] for c in self.COLS}
        self.wait_len: list[np.ndarray] = []
        self.wait_pairs: list[np.ndarray] = []  # (m, 2) counter, target
        self.sig_len: list[np.ndarray] = []
        self.sig_ids: list[np.ndarray] = []
        self.counters: list[str] = []
        self.targets: list[int] = []

    def counter(self, name: str, target: int) -> int:
        self.counters.append(name)
        self.targets.append(int(target))
        return len(self.counters) - 1

    def add(self, kind: str, n: int, waits: np.ndarray | None = None, signal=-1, **cols) -> None:
        """n tasks, each with w waits ((n, w, 2) counter/target) and one signal (per task or for all; -1: none)."""
        if n == 0:
            return
        w = np.zeros((n, 0, 2), np.int64) if waits is None else np.asarray(waits, np.int64).reshape(n, -1, 2)
        sig = np.broadcast_to(np.asarray(signal, np.int64), (n,))
        for c in self.COLS:
            v = KIND_CODE[kind] if c == "kind" else cols.get(c, -1 if c in ("expert", "weight_id") else 0)
            self.parts[c].append(np.broadcast_to(np.asarray(v), (n,)).copy())
        self.wait_len.append(np.full(n, w.shape[1], np.int64))
        self.wait_pairs.append(w.reshape(-1, 2))
        self.sig_len.append((sig >= 0).astype(np.int64))
        self.sig_ids.append(sig[sig >= 0])

    def build(self) -> dict:
        dtypes = {"kind": np.int8, "weight_bytes": np.float64, "in_bytes": np.float64, "out_bytes": np.float64,
                  "flops": np.float64, "weight_id": np.int64}
        out = {c: (np.concatenate(v) if v else np.zeros(0)).astype(dtypes.get(c, np.int32)) for c, v in self.parts.items()}

        def csr(lens):
            ln = np.concatenate(lens) if lens else np.zeros(0, np.int64)
            ptr = np.zeros(ln.size + 1, np.int64)
            np.cumsum(ln, out=ptr[1:])
            return ptr

        flat = np.concatenate(self.wait_pairs) if self.wait_pairs else np.zeros((0, 2), np.int64)
        sig = np.concatenate(self.sig_ids) if self.sig_ids else np.zeros(0, np.int64)
        out.update(wait_ptr=csr(self.wait_len), wait_counter=flat[:, 0].astype(np.int32),
                   wait_target=flat[:, 1].astype(np.int64), signal_ptr=csr(self.sig_len),
                   signal_counter=sig.astype(np.int32))
        return out


def _add_gemm(bld: _Builder, kind: str, B: int, n_tiles: int, k_tiles: int, D: int, BN: int, N: int, mats: int,
              bm: int, group_m: int, block_expert, block_rows, ab: int, wb: float, signal, waits,
              extra_in=0, extra_out=0) -> None:
    """A GEMM phase's B x n_tiles tiles (grouped order) as tasks over reduction length D; N the
    output width, mats 2 for GEMM 1. ``signal`` / ``waits``: counters per row block (B,) or one id."""
    n = B * n_tiles
    bb, nn = tile_ids(np.arange(n), B, n_tiles, group_m)
    e, rows = block_expert[bb], block_rows[bb]
    ncol = np.minimum(BN, N - nn * BN)
    base = (1 << 40) * (1 if kind == "gemm1" else 2)
    per_block = lambda c: np.asarray(c)[bb] if np.ndim(c) else c  # noqa: E731 - used three times
    bld.add(kind, n, _w(n, *((per_block(c), t) for c, t in waits)), signal=per_block(signal), expert=e, block=bb,
            n_tile=nn, rows=rows, tile_m=bm, tile_n=mats * BN, depth=D,
            weight_bytes=mats * ncol * D * wb, in_bytes=rows * D * ab + extra_in,
            out_bytes=rows * ncol * ab + extra_out, flops=2.0 * bm * mats * BN * D,
            weight_id=base + (e.astype(np.int64) * n_tiles + nn) * k_tiles)


def _w(n: int, *pairs) -> np.ndarray:
    """Waits for n tasks: each pair (counter ids (n,) or scalar, targets (n,) or scalar)."""
    cols = [np.stack([np.broadcast_to(c, (n,)), np.broadcast_to(t, (n,))], axis=-1) for c, t in pairs]
    return np.stack(cols, axis=1) if cols else np.zeros((n, 0, 2), np.int64)


def _add_shared_gemm1(bld: _Builder, T: int, H: int, Is: int, Ms: int, ns1: int, sh: dict, group_m: int,
                      ab: int, wb: float) -> np.ndarray:
    """The shared MLP's GEMM 1 tasks (static: Ms row blocks x ns1 column blocks); their counters (Ms,)."""
    sh1_c = np.array([bld.counter(f"shared1[{m}]", ns1) for m in range(Ms)], np.int64)
    mm, nn = tile_ids(np.arange(Ms * ns1), Ms, ns1, group_m)
    srows = np.minimum(sh["BLOCK_M"], T - mm * sh["BLOCK_M"])
    ncol = np.minimum(sh["BLOCK_N1"], Is - nn * sh["BLOCK_N1"])
    bld.add("shared_gemm1", Ms * ns1, block=mm, n_tile=nn, rows=srows, tile_m=sh["BLOCK_M"],
            tile_n=2 * sh["BLOCK_N1"], depth=H, weight_bytes=2 * ncol * H * wb, in_bytes=srows * H * ab,
            out_bytes=srows * ncol * ab, flops=2.0 * sh["BLOCK_M"] * 2 * sh["BLOCK_N1"] * H,
            weight_id=20_000 + nn, signal=sh1_c[mm])
    return sh1_c


def _add_combine(bld: _Builder, T: int, H: int, KS: int, n: int, cb: dict, ab: int, ready: tuple) -> None:
    """The n combine tasks (token block x column block), each waiting for every GEMM 2 (``ready``)."""
    tt, hh = np.divmod(np.arange(n), cdiv(H, cb["BLOCK_H"]))
    trows = np.minimum(cb["BLOCK_T"], T - tt * cb["BLOCK_T"])
    hcol = np.minimum(cb["BLOCK_H"], H - hh * cb["BLOCK_H"])
    bld.add("combine", n, _w(n, ready), block=tt, n_tile=hh, rows=trows, tile_m=cb["BLOCK_T"],
            tile_n=cb["BLOCK_H"], in_bytes=trows * KS * hcol * ab,
            out_bytes=trows * hcol * ab)


def task_plan(config, counts, T: int, tiles: dict, *, act_bytes: int = 2, weight_bytes: float | None = None,
              num_programs: int = 1, routing_given: bool = False) -> TaskPlan:
    """The ordered tasks of the megakernel for ``config`` on T tokens whose pairs per expert are
    ``counts`` (E,) (``np.bincount(topk_idx.ravel(), minlength=E)``; they sum to T*K).

    ``tiles``: the keys of ``TILE_KEYS`` per part (GEMM 2 shares GEMM 1's BLOCK_M). ``act_bytes`` /
    ``weight_bytes``: bytes per element. ``routing_given``: the top-k tasks only read the routing
    and count (SPLIT must be 1).
    """
    lay = task_layout(config, T, tiles)
    E, K, H, I = config.num_experts, config.top_k, config.hidden_size, config.intermediate_size
    counts = np.asarray(counts)
    if counts.dtype.kind not in "iu" or counts.shape != (E,) or (counts.size and counts.min() < 0) \
            or int(counts.sum()) != T * K:
        raise InputError(f"counts must be (E,)=({E},) non-negative integers summing to T*K={T * K}, "
                         f"got shape {list(counts.shape)} sum {int(counts.sum()) if counts.size else 0}")
    counts = counts.astype(np.int64)
    ab = int(act_bytes)
    wb = ab if weight_bytes is None else float(weight_bytes)  # FP8: 1 byte plus its share of the block scales
    r, g1, g2, sh, cb = tiles["router"], tiles["gemm1"], tiles["gemm2"], tiles["shared"], tiles["combine"]
    group_m = tiles["order"]["GROUP_M"]
    shared = config.num_shared_experts > 0
    KS = K + (1 if shared else 0)
    Is = config.shared_intermediate_size
    C, G, split = lay.num_chunks, lay.topk_groups, lay.split
    bt, tt = r["BLOCK_T"], lay.topk_t
    bld = _Builder()
    topk_c = bld.counter("topk", G)
    aligned = G > 1 and not lay.align_each  # scan and scatter tasks (G = 1: the top-k task aligns; waits name topk)
    scan_c = bld.counter("scan", 1 if aligned else 0)
    scat_c = bld.counter("scatter", G if aligned else 0)
    chunk = np.arange(C)
    chunk_rows = np.minimum(bt, T - chunk * bt)
    group = np.arange(G)
    group_rows = np.minimum(tt, T - group * tt)

    # ---- router
    if routing_given and split > 1:
        raise InputError(f"routing_given takes no router logits: tiles['router']['SPLIT'] must be 1, got {split}")
    if lay.route_each and split <= 1 and not routing_given:
        raise InputError("tiles['router']['EACH']=1 routes the token from a split router's logits (SPLIT > 1) "
                         "or reads a routing given (routing_given=True); got neither")
    if split > 1:
        logit_c = np.array([bld.counter(f"logits[{c}]", split) for c in range(C)], np.int64)
        cc, ss = np.divmod(np.arange(C * split), split)
        hlen = np.minimum(lay.h_per, H - ss * lay.h_per)
        bld.add("router_logits", C * split, block=cc, n_tile=ss, rows=chunk_rows[cc], tile_m=bt, tile_n=E,
                depth=hlen, weight_bytes=E * hlen * wb, in_bytes=chunk_rows[cc] * hlen * ab,
                out_bytes=chunk_rows[cc] * E * 4, flops=2.0 * bt * E * hlen, weight_id=10_000 + ss,
                signal=logit_c[cc])
        topk_in = split * group_rows * E * 4
        topk_w, topk_flops, topk_wait = 0, 0.0, _w(G, (logit_c[group * tt // bt], split))
    elif routing_given:
        topk_in = group_rows * K * 8
        topk_w, topk_flops, topk_wait = 0, 0.0, None
    else:
        topk_in = group_rows * H * ab
        topk_w, topk_flops, topk_wait = E * H * wb, 2.0 * bt * E * H, None
    topk_out = (0 if routing_given else group_rows * K * 8) + E * 4
    if G == 1:  # one program holds every token: it aligns too
        topk_out = topk_out + T * K * 12 + 4 * (2 * E + 1)
    bld.add("router_topk", G, topk_wait, block=group, rows=group_rows, tile_m=tt, tile_n=E,
            depth=H if split == 1 and not routing_given else 0, weight_bytes=topk_w, in_bytes=topk_in,
            out_bytes=topk_out, flops=topk_flops, weight_id=10_000 if topk_w else -1, signal=topk_c)
    if aligned:
        bld.add("align_scan", 1, _w(1, (topk_c, G)), rows=T * K, tile_n=E, depth=G, in_bytes=4 * G * E,
                out_bytes=4 * (G * E + 2 * E + 1 + lay.b_max), signal=scan_c)
        bld.add("align_scatter", G, _w(G, (scan_c, 1)), block=group, rows=group_rows * K, tile_m=tt, tile_n=E,
                in_bytes=group_rows * K * 4 + 8 * E, out_bytes=group_rows * K * 12, signal=scat_c)

    # ---- shared MLP, GEMM 1 (static)
    Ms, ns1, ns2 = lay.shared_m_blocks, lay.ns1, lay.ns2
    if shared:
        sh1_c = _add_shared_gemm1(bld, T, H, Is, Ms, ns1, sh, group_m, ab, wb)

    # ---- routed row blocks (dynamic: from the counts)
    bm = g1["BLOCK_M"]
    blocks_e = -(-counts // bm)
    B = int(blocks_e.sum())
    block_expert = np.repeat(np.arange(E), blocks_e)
    first_block = np.concatenate([[0], np.cumsum(blocks_e)[:-1]]) if E else np.zeros(0, np.int64)
    block_rows = np.minimum(bm, counts[block_expert] - (np.arange(B) - first_block[block_expert]) * bm)
    n1, n2 = lay.n1, lay.n2
    g2_total = B * n2 + Ms * ns2
    g1_c = np.array([bld.counter(f"g1[{b}]", n1) for b in range(B)], np.int64)
    g2_c = bld.counter("g2", g2_total)
    # the rows in place: the scatter tasks, the top-k task (one group) or every group's routing (ALIGN_EACH)
    rows_ready = (scat_c, G) if aligned else (topk_c, G)
    # ALIGN_EACH: a program's first dynamic task reads the G x E histograms (charged below)
    layout_in = G * E * 4 if lay.align_each else 0
    # GEMM 1; EACH: each task routes the token; ALIGN_EACH: each reads the T x K ids, writes its block's rows
    ready, extra = rows_ready, {}
    if lay.route_each:  # from the logits' partials, or the routing given (no wait: nothing computes it)
        ready = None if routing_given else (logit_c[0], split)
        extra = dict(extra_in=np.ravel(topk_in)[0], extra_out=np.ravel(topk_out)[0])
    elif lay.align_each:
        extra = dict(extra_in=T * K * 4, extra_out=bm * 8)
    _add_gemm(bld, "gemm1", B, n1, lay.k1, H, g1["BLOCK_N"], I, 2, bm, group_m, block_expert, block_rows, ab, wb,
              g1_c, [] if ready is None else [ready], **extra)
    if shared:
        mm, nn = tile_ids(np.arange(Ms * ns2), Ms, ns2, group_m)
        srows = np.minimum(sh["BLOCK_M"], T - mm * sh["BLOCK_M"])
        ncol = np.minimum(sh["BLOCK_N2"], H - nn * sh["BLOCK_N2"])
        # every dynamic task first waits for the block layout (scan, or the top-k task that aligned)
        layout_ready = (scan_c, 1) if aligned else (topk_c, G)
        pairs = [(sh1_c[mm], ns1), layout_ready] + ([(topk_c, G)] if config.shared_expert_gate else [])
        bld.add("shared_gemm2", Ms * ns2, _w(Ms * ns2, *pairs), block=mm, n_tile=nn, rows=srows,
                tile_m=sh["BLOCK_M"], tile_n=sh["BLOCK_N2"], depth=Is, weight_bytes=ncol * Is * wb,
                in_bytes=srows * Is * ab, out_bytes=srows * ncol * ab, flops=2.0 * sh["BLOCK_M"] * sh["BLOCK_N2"] * Is,
                weight_id=30_000 + nn, signal=g2_c)
    _add_gemm(bld, "gemm2", B, n2, lay.k2, I, g2["BLOCK_N"], H, 1, bm, group_m, block_expert, block_rows, ab, wb,
              g2_c, [(g1_c, n1)])
    _add_combine(bld, T, H, KS, lay.combine_tasks, cb, ab, (g2_c, g2_total))
    arrays = bld.build()
    if layout_in:  # each program's first dynamic ticket, when the programs take the tickets in order
        arrays["in_bytes"][lay.s0:lay.s0 + max(1, int(num_programs))] += layout_in
    return TaskPlan(config_name=config.name, num_tokens=int(T), tiles=tiles, layout=lay, counts=counts,
                    num_programs=int(num_programs), counters=tuple(bld.counters),
                    counter_target=np.asarray(bld.targets, np.int64), topk_passes=topk_passes(config), **arrays)
