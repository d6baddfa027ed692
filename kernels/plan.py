"""The launch plan as data: what ``moe.moe_forward`` will launch for a config and a routing.

Shape legend: T tokens, E experts, K top-k, H hidden, I expert width, Is shared width,
BM/BN/BK tile sizes, S split-K factor, C router chunks.

Pure Python and NumPy. ``launch_plan(config, topk_idx=idx).stages``: one Stage per launch; bytes
DRAM-side per working program, FLOPs of the padded rows (2 per multiply-add).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from functools import lru_cache

import numpy as np

from ..reference.config import ROUTERS
from ..reference.sizes import FP8_BLOCK, dtype_bytes, row_bytes, weight_bytes_per_element
from ..reference.tiles import cdiv, max_row_blocks, scan_block, topk_passes
from . import configs as cfgs
from .configs import pow2
from .fp8_plan import FP8_MODES, FP8Options, fp8_entry
from .thresholds import Thresholds


@dataclass(frozen=True)
class Stage:
    """One kernel launch: grid (fixed for T); active_programs (or, persistent, tiles walked); tile
    (BLOCK_*, num_warps, num_stages, SPLIT_K); tiles_per_expert (E,) or None; bytes_per_tile /
    flops_per_tile per working program."""

    name: str
    kernel: str
    grid: tuple[int, ...]
    active_programs: int
    tile: dict
    bytes_per_tile: float
    flops_per_tile: float
    tiles_per_expert: tuple[int, ...] | None = None
    note: str = ""
    #: expert GEMMs: bytes of one program's operands {"a", "b", "out"} and row blocks (E,) per expert
    operand_bytes_per_tile: dict | None = None
    row_blocks_per_expert: tuple[int, ...] | None = None
    #: one program's MMA work {"m", "n", "depth"} and its serial steps {"load", "reduce"}, for the cost model
    work_tile: dict | None = None
    serial_steps: dict | None = None
    #: the tensor cores' format: "bf16" (weight-only FP8 included) or "fp8" (e4m3 x e4m3); None: no MMA
    mma_dtype: str | None = None
    #: how the GEMM's tile loop loads its operands, a key of simulator.hardware.GEMM_LOADS; None: no GEMM
    loads: str | None = None
    #: shared memory of one program's pipeline buffers, bytes (``gemm_shared_bytes``); None: not estimated
    shared_bytes: int | None = None

    @property
    def total_bytes(self) -> float:
        return self.bytes_per_tile * self.active_programs

    @property
    def total_flops(self) -> float:
        return self.flops_per_tile * self.active_programs

    @property
    def programs(self) -> int:
        return int(np.prod(self.grid)) if self.grid else 0

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(total_bytes=self.total_bytes, total_flops=self.total_flops, programs=self.programs)
        return d


@dataclass(frozen=True)
class LaunchPlan:
    config_name: str
    num_tokens: int
    dtype: str
    device_name: str
    triton_version: str
    block_m: int
    counts: tuple[int, ...]
    deterministic: bool
    stages: tuple[Stage, ...] = field(default_factory=tuple)
    fp8: str | None = None  # static_plan's: None, "weights" or "weights+act"

    @property
    def total_bytes(self) -> float:
        return sum(s.total_bytes for s in self.stages)

    @property
    def total_flops(self) -> float:
        return sum(s.total_flops for s in self.stages)

    @property
    def num_launches(self) -> int:
        return len(self.stages)

    def stage(self, name: str) -> Stage:
        for s in self.stages:
            if s.name == name:
                return s
        raise KeyError(f"no stage {name!r}; stages: {[s.name for s in self.stages]}")

    def to_dict(self) -> dict:
        return {
            "config_name": self.config_name, "num_tokens": self.num_tokens, "dtype": self.dtype,
            "device_name": self.device_name, "triton_version": self.triton_version, "block_m": self.block_m,
            "counts": list(self.counts), "deterministic": self.deterministic, "fp8": self.fp8,
            "total_bytes": self.total_bytes, "total_flops": self.total_flops,
            "stages": [s.to_dict() for s in self.stages],
        }


def _triton_version() -> str:
    try:
        from importlib.metadata import version

        return version("triton")
    except Exception:  # noqa: BLE001 - triton not installed: heuristics only
        return "none"


def launch_plan(config, T: int | None = None, *, topk_idx=None, counts=None, dtype: str = "bfloat16",
                device_name: str = "NVIDIA H200", triton_version: str | None = None,
                deterministic: bool = True, num_sms: int | None = None, gemm: dict | None = None,
                shared_gemm: dict | None = None, fp8: str | None = None, router: dict | None = None,
                fp8_options: FP8Options | None = None) -> LaunchPlan:
    """The kernels ``moe_forward`` launches for ``config`` on T tokens routed as ``topk_idx`` (T, K)
    or as per-expert pair ``counts`` (E,) (then T is required); keywords as for ``static_plan``."""
    E, K, H, I = config.num_experts, config.top_k, config.hidden_size, config.intermediate_size
    if topk_idx is not None:
        idx = np.asarray(topk_idx)
        if idx.ndim != 2 or idx.shape[1] != K:
            raise ValueError(f"topk_idx must have shape [T, {K}], got {list(idx.shape)}")
        if T is not None and T != idx.shape[0]:
            raise ValueError(f"T={T} disagrees with topk_idx's {idx.shape[0]} rows")
        T = idx.shape[0]
        counts = np.bincount(idx.reshape(-1).astype(np.int64), minlength=E)
    elif counts is not None:
        if T is None:
            raise ValueError("launch_plan(counts=...) needs T")
        counts = np.asarray(counts, dtype=np.int64)
        if counts.shape != (E,) or counts.min(initial=0) < 0 or counts.sum() != T * K:
            raise ValueError(f"counts must be (E,)=({E},) non-negative and sum to T*K={T * K}")
    else:
        raise ValueError("launch_plan needs topk_idx or counts")
    counts = counts.astype(np.int64)
    tv = triton_version or _triton_version()
    b = dtype_bytes(dtype)
    sp = static_plan(config, T, dtype=dtype, device_name=device_name, triton_version=tv, deterministic=deterministic,
                     num_sms=num_sms, gemm=gemm, shared_gemm=shared_gemm, fp8=fp8, router=router,
                     fp8_options=fp8_options)
    # bytes per element of the expert weights and of the activation between the GEMMs, and the MMA format
    wb = weight_bytes_per_element("fp8_e4m3") if fp8 else float(b)
    fp8_act = fp8 == "weights+act"
    ab = row_bytes(I, "fp8_e4m3") / I if fp8_act else float(b)
    mma = "fp8" if fp8_act else "bf16"
    g1, g2 = sp.gemm["gemm1"], sp.gemm["gemm2"]
    bm = g1["BLOCK_M"]
    KS = sp.KS
    stages: list[Stage] = []
    if T == 0:
        return LaunchPlan(config.name, 0, dtype, device_name, tv, bm, tuple(int(c) for c in counts),
                          deterministic, (), fp8)

    # ---- router (routing.py)
    rl = sp.router
    bt, C, split, h_per = rl["BLOCK_T"], rl["C"], rl["SPLIT"], rl["H_PER_SPLIT"]
    rtile = {k: rl[k] for k in ("BLOCK_T", "BLOCK_E", "BLOCK_H", "num_warps")}
    if split:
        lt = rl["LOGITS_T"]
        stages.append(Stage("router_logits", "_router_logits_kernel", rl["logits_grid"],
                            rl["logits_grid"][0] * split,
                            dict(rtile, BLOCK_T=lt, num_warps=rl["logits_warps"], SPLIT=split),
                            bytes_per_tile=(lt * h_per + E * h_per) * b + lt * E * 4,
                            flops_per_tile=2 * lt * E * h_per,
                            note="split-H partial logits (decode: the routing blocks; prefill: 128-token tiles)",
                            work_tile={"m": lt, "n": rl["BLOCK_E"], "depth": h_per},
                            serial_steps={"load": cdiv(h_per, rl["BLOCK_H"]), "reduce": 0}))
        rbytes = split * bt * E * 4 + bt * K * 8
        rflops, rload = 0.0, 0
    else:
        rbytes = (bt * H + E * H) * b + bt * K * 8
        rflops, rload = 2 * bt * E * H, cdiv(H, rl["BLOCK_H"])
    fused = C == 1
    P_max, B_max = sp.P_max, sp.B_max
    # the selection's key for the cost model (kernel_model.route_select), for a program reading partials
    select = dict(ROUTER=ROUTERS.index(config.router), K=K, N_GROUP=config.n_group, BITONIC=int(rl["BITONIC"])) \
        if split else {}
    stages.append(Stage("router", "_router_kernel", rl["grid"], C, dict(rtile, FUSE_ALIGN=fused, **select),
                        bytes_per_tile=rbytes + (8 * P_max + 4 * T * K if fused else 4 * E),
                        flops_per_tile=rflops, note="top-k; aligns too when one program holds every token",
                        work_tile={"m": bt, "n": rl["BLOCK_E"], "depth": H if not split else 0},
                        serial_steps={"load": rload, "reduce": 2 if fused else 0, "select": topk_passes(config)}))
    if not fused:
        al = sp.align
        ex, nl = al["BLOCK_EX"], al["layout_grid"][0]
        stages.append(Stage("align_scan", "_scan_experts_kernel", al["scan_grid"], al["scan_grid"][0],
                            dict(BLOCK_EX=ex, BLOCK_C=al["BLOCK_CS"]),
                            bytes_per_tile=8 * C * ex + 4 * ex, flops_per_tile=0.0,
                            serial_steps={"load": 0, "reduce": cdiv(C, al["BLOCK_CS"])}))
        stages.append(Stage("align_layout", "_layout_kernel", al["layout_grid"], nl,
                            dict(BLOCK_M=bm, BLOCK_E=al["BLOCK_E"], BLOCK_B=al["BLOCK_B"]),
                            bytes_per_tile=4 * E + 4 * al["BLOCK_B"] + 8 * al["BLOCK_B"] * bm / 2, flops_per_tile=0.0,
                            serial_steps={"load": 0, "reduce": 2}))
        # a program per BLOCK_P pairs of a chunk; one serial step, the row sum of its compare
        bp = al["BLOCK_P"]
        stages.append(Stage("align_scatter", "_scatter_pairs_kernel", al["scatter_grid"], int(np.prod(al["scatter_grid"])),
                            dict(BLOCK_T=bt, BLOCK_P=bp, BLOCK_J=al["BLOCK_J"], num_warps=al["scatter_warps"]),
                            bytes_per_tile=4 * bt * K + bp * (8 + 12), flops_per_tile=0.0,
                            serial_steps={"load": 0, "reduce": 1}))

    # ---- x quantized once (fp8_gemm._quantize_x_kernel): the FP8 GEMM 1s then read e4m3 rows and their scales
    xb = float(b)
    if sp.quant:
        ql = sp.quant
        qt = ql["BLOCK_T"] * ql["KB"]
        stages.append(Stage("quantize_x", "_quantize_x_kernel", ql["grid"], int(np.prod(ql["grid"])),
                            dict(BLOCK_T=ql["BLOCK_T"], KB=ql["KB"], num_warps=ql["num_warps"]),
                            bytes_per_tile=qt * b + qt + 4 * ql["BLOCK_T"], flops_per_tile=4 * qt,
                            note="x -> e4m3 codes and a scale per token per 128 columns, once for every GEMM 1"))
        xb = row_bytes(H, "fp8_e4m3") / H

    # ---- routed experts (grouped_gemm.py)
    blocks_e = -(-counts // bm)  # row blocks per expert
    active_blocks = int(blocks_e.sum())
    stages += _gemm_stages("gemm1", "gemm2", g1, g2, blocks_e, active_blocks, B_max, H, I, b, T, KS,
                           bias=config.expert_bias, deterministic=deterministic, act=sp.act, num_sms=sp.num_sms,
                           wb=wb, ab=ab, mma=mma, fp8=fp8, xb=xb)
    split2 = sp.split2

    # ---- shared MLP (dense: every token)
    if sp.shared:
        Is = config.shared_intermediate_size
        nm = sp.shared_m
        stages += _gemm_stages("shared_gemm1", "shared_gemm2", sp.shared["gemm1"], sp.shared["gemm2"],
                               np.array([nm]), nm, nm, H, Is, b, T, KS, bias=False, deterministic=deterministic,
                               act=sp.shared_act, num_sms=sp.num_sms, wb=wb,
                               ab=row_bytes(Is, "fp8_e4m3") / Is if fp8_act else float(b), mma=mma, fp8=fp8,
                               xb=xb)

    # ---- combine
    atomic = sp.atomic
    if sp.combine:
        cl = sp.combine
        rows = 1 if atomic else KS * split2
        block_t, block_h = cl["BLOCK_T"], cl["BLOCK_H"]
        grid = cl["grid"]
        src_b = 4 if (atomic or split2 > 1) else b
        stages.append(Stage("combine", "_combine_kernel", grid, grid[0] * grid[1],
                            dict(BLOCK_T=block_t, BLOCK_H=block_h, KS=KS, SPLIT=1 if atomic else split2,
                                 num_warps=cl["num_warps"]),
                            bytes_per_tile=block_t * block_h * (rows * src_b + b), flops_per_tile=block_t * block_h * rows,
                            note="atomic: cast only" if atomic else "fixed-order sum: deterministic"))
    return LaunchPlan(config.name, T, dtype, device_name, tv, bm, tuple(int(c) for c in counts), deterministic,
                      tuple(stages), fp8)


GEMM_KERNELS = {("gemm1", "pointer"): "_gemm1_kernel", ("gemm2", "pointer"): "_gemm2_kernel",
                ("gemm1", "tma_persistent"): "_gemm1_tma_kernel", ("gemm2", "tma_persistent"): "_gemm2_tma_kernel",
                ("gemm1", "fp8"): "_gemm1_fp8_kernel", ("gemm2", "fp8"): "_gemm2_fp8_kernel",
                ("gemm1", "fp8w_tma"): "_gemm1_fp8w_tma_kernel", ("gemm2", "fp8w_tma"): "_gemm2_fp8w_tma_kernel",
                ("gemm1", "fp8a_tma"): "_gemm1_fp8a_kernel", ("gemm2", "fp8a_tma"): "_gemm2_fp8a_kernel"}


def _kernel_key(g: dict, fp8) -> str:
    """GEMM_KERNELS' second key for a GEMM config: its variant, or "fp8" / "fp8a_tma" / "fp8w_tma"."""
    if not fp8:
        return g["variant"]
    if g.get("variant") != "tma_persistent":
        return "fp8"
    return "fp8a_tma" if fp8 == "weights+act" else "fp8w_tma"


def gemm_shared_bytes(g: dict, a_bytes: float, w_bytes: float, weight_tiles: int) -> int:
    """Shared memory of one program of GEMM config ``g``: num_stages (wgmma, BLOCK_M >= 64) or
    num_stages - 1 (mma.sync) buffers of one A tile and ``weight_tiles`` weight tiles."""
    bm, bn, bk = int(g["BLOCK_M"]), int(g["BLOCK_N"]), int(g["BLOCK_K"])
    buffers = max(1, int(g["num_stages"]) - (0 if bm >= 64 else 1))
    return int(buffers * (bm * bk * a_bytes + weight_tiles * bn * bk * w_bytes))


def _gemm_stages(n1, n2, g1, g2, blocks_e, active_blocks, num_m, H, I, b, T, KS, *, bias, deterministic, act,
                 num_sms, wb=None, ab=None, mma="bf16", fp8=None, xb=None):
    """GEMM 1 (+ its split-K activation kernel) and GEMM 2 for row blocks ``blocks_e`` (E,).
    b: bytes per element of x and the output; wb of the weights, ab of the activation between the
    GEMMs, xb of GEMM 1's gathered rows (default b); mma: the tensor cores' format; fp8: the FP8 mode."""
    wb = float(b) if wb is None else wb
    ab = float(b) if ab is None else ab
    xb = float(b) if xb is None else xb
    tma1 = g1.get("variant") == "tma_persistent"
    tma2 = g2.get("variant") == "tma_persistent"
    out = []
    bm = g1["BLOCK_M"]
    s1 = g1.get("SPLIT_K", 1)
    nt1 = -(-I // g1["BLOCK_N"])
    kh = H / s1
    ops1 = {"a": bm * kh * xb, "b": 2 * g1["BLOCK_N"] * kh * wb,
            "out": 2 * bm * g1["BLOCK_N"] * 4 if s1 > 1 else bm * g1["BLOCK_N"] * ab}
    bytes1 = ops1["a"] + ops1["b"] + ops1["out"]
    row_blocks = tuple(int(x) for x in blocks_e)
    out.append(Stage(n1, GEMM_KERNELS["gemm1", _kernel_key(g1, fp8)], gemm_grid(num_m, I, g1, num_sms=num_sms),
                     active_blocks * nt1 * s1, dict(g1),
                     bytes_per_tile=bytes1, flops_per_tile=2 * bm * 2 * g1["BLOCK_N"] * kh,
                     tiles_per_expert=tuple(int(x) for x in blocks_e * nt1 * s1),
                     note=("split-K partials" if s1 > 1 else "gather x rows; gate and up; activation in the epilogue"
                           + ("; weights by TMA, persistent programs" if g1["variant"] == "tma_persistent" else "")),
                     operand_bytes_per_tile=ops1, row_blocks_per_expert=row_blocks,
                     work_tile={"m": bm, "n": 2 * g1["BLOCK_N"], "depth": kh}, mma_dtype=mma,
                     loads=("tma_persistent_gated" + ("_flat" if g1.get("FLATTEN") else "")) if tma1
                     else "pointer_gated", shared_bytes=None if fp8 else gemm_shared_bytes(g1, xb, wb, 2)))
    if s1 > 1:
        bn = act["BLOCK_N"]
        nta = -(-I // bn)
        out.append(Stage(n1 + "_act", "_act_kernel", act["grid"], active_blocks * nta,
                         dict(BLOCK_M=bm, BLOCK_N=bn, SPLIT_K=s1, num_warps=act["num_warps"]),
                         bytes_per_tile=bm * bn * (2 * 4 * s1 + b), flops_per_tile=8 * bm * bn * s1,
                         tiles_per_expert=tuple(int(x) for x in blocks_e * nta)))
    s2 = g2.get("SPLIT_K", 1)
    nt2 = -(-H // g2["BLOCK_N"])
    ki = I / s2
    ob = 4 if (s2 > 1 or not deterministic) else b
    ops2 = {"a": bm * ki * ab, "b": g2["BLOCK_N"] * ki * wb, "out": bm * g2["BLOCK_N"] * ob}
    bytes2 = ops2["a"] + ops2["b"] + ops2["out"]
    out.append(Stage(n2, GEMM_KERNELS["gemm2", _kernel_key(g2, fp8)], gemm_grid(num_m, H, g2, num_sms=num_sms),
                     active_blocks * nt2 * s2, dict(g2),
                     bytes_per_tile=bytes2, flops_per_tile=2 * bm * g2["BLOCK_N"] * ki,
                     tiles_per_expert=tuple(int(x) for x in blocks_e * nt2 * s2),
                     note="routing weight in the epilogue; rows to the pair buffer"
                          + ("; rows and weights by TMA, persistent programs" if g2["variant"] == "tma_persistent" else ""),
                     operand_bytes_per_tile=ops2, row_blocks_per_expert=row_blocks,
                     work_tile={"m": bm, "n": g2["BLOCK_N"], "depth": ki}, mma_dtype=mma,
                     loads=("tma_ab_persistent" + ("_flat" if g2.get("FLATTEN") else "")) if tma2 else "pointer",
                     shared_bytes=None if fp8 else gemm_shared_bytes(g2, ab, wb, 1)))
    return out


def describe(plan: LaunchPlan) -> str:
    """A short table of the plan, one line per launch."""
    lines = [f"{plan.config_name} T={plan.num_tokens} BM={plan.block_m} on {plan.device_name} (triton {plan.triton_version})"]
    for s in plan.stages:
        lines.append(f"  {s.name:<16}{s.kernel:<24} grid={s.grid!s:<14} active={s.active_programs:<7} "
                     f"MB={s.total_bytes / 1e6:9.2f} GFLOP={s.total_flops / 1e9:9.3f}")
    lines.append(f"  total MB={plan.total_bytes / 1e6:.2f} GFLOP={plan.total_flops / 1e9:.3f} launches={plan.num_launches}")
    return "\n".join(lines)


# --------------------------------------------------------------------------- launch sizes
# Each function below is the one place a launch's sizes are derived; launch_plan and the launchers use it.


def router_launch(T: int, E: int, H: int, K: int, n_group: int = 1, *, interpret: bool = False,
                  split: int | None = None, num_sms: int = cfgs.DEFAULT_SMS, tiles: bool | None = None,
                  warps: int | None = None, bitonic: bool | None = None, block_h: int | None = None) -> dict:
    """The router's launches for T tokens: chunks C of BLOCK_T tokens, BLOCK_E/K/G, warps, and the
    split-H logits launch (SPLIT ranges of H_PER_SPLIT columns; 0: the routing program walks H).
    ``tiles``, ``split``, ``warps``, ``bitonic`` and ``block_h`` override the configs.py defaults."""
    bt = cfgs.router_block_t(T, E)
    block_e = max(16, pow2(E))
    if tiles is None:
        tiles = cfgs.router_prefill(T, E, H, interpret=interpret)
    if split is None:
        split = (cfgs.prefill_router_split(T, E, H, interpret=interpret, num_sms=num_sms) if tiles
                 else cfgs.decode_router_split(T, E, H, interpret=interpret))
    if block_h is not None and (split or block_h < 16 or block_h & (block_h - 1)):
        raise ValueError(f"router_launch: block_h={block_h} is the walking routing program's step, a power of "
                         f"two >= 16, and needs split=0 (got split={split}: a logits launch walks H instead)")
    if split:
        lt, block_h = cfgs.router_logits_tile(T, E, H, interpret=interpret, tiles=tiles)
    else:  # the routing program walks H: its own step (router_block_h unless asked), its own tokens
        lt, block_h = bt, block_h or cfgs.walk_block_h(T, E, H, interpret=interpret)
    h_per, sp = H, 0
    if split > 0:
        h_per = cdiv(cdiv(H, split), block_h) * block_h
        sp = cdiv(H, h_per)
    C = cdiv(T, bt) if T else 0
    if warps is None:
        warps = cfgs.router_warps(bt, block_e, walks=not sp)
    if bitonic is None:
        bitonic = cfgs.router_bitonic(block_e, K, C)
    return {"C": C, "grid": (C,), "logits_grid": (cdiv(T, lt) if T else 0, sp), "BLOCK_T": bt, "LOGITS_T": lt,
            "BLOCK_E": block_e, "BLOCK_H": block_h, "BLOCK_K": max(2, pow2(K)), "BLOCK_G": max(2, pow2(n_group)),
            "SPLIT": sp, "H_PER_SPLIT": h_per, "num_warps": warps, "BITONIC": bool(bitonic),
            "logits_warps": 8 if lt * block_e > 4096 or block_e > 128 else 4}


def align_blocks(E: int, block_m: int, B_max: int) -> dict:
    """Block sizes of the align code (shared by the router's fused single-chunk path)."""
    block_e = max(16, pow2(E))
    return dict(BLOCK_E=block_e, BLOCK_B=max(16, min(64 if block_e <= 128 else 32, pow2(max(B_max, 1)))),
                BLOCK_PAD=max(2, pow2(block_m)))


_TH = Thresholds("align")  # configs/thresholds.json: each value's unit and evidence
#: the widest expert block (BLOCK_E) the align kernels run in 4 warps (8 past it)
ALIGN_WARPS4_MAX_E = _TH["ALIGN_WARPS4_MAX_E"]
#: experts per program of the multi-launch scan, and its chunk rows a step
ALIGN_SCAN_EXPERTS = _TH["ALIGN_SCAN_EXPERTS"]
ALIGN_SCAN_CHUNKS = _TH["ALIGN_SCAN_CHUNKS"]
#: pairs per program of the multi-launch scatter, and its warps
ALIGN_SCATTER_PAIRS = _TH["ALIGN_SCATTER_PAIRS"]
ALIGN_SCATTER_WARPS = _TH["ALIGN_SCATTER_WARPS"]
_TH.close()


def align_launch(C: int, K: int, E: int, block_t: int, block_m: int, B_max: int) -> dict:
    """Sizes of the align launches: scan (ALIGN_SCAN_EXPERTS experts a program), layout (BLOCK_B
    row blocks), scatter (grid (C, pairs / BLOCK_P), comparing with the chunk's BLOCK_J) and the
    histogram; BLOCK_C: the megakernel's one-task scan step."""
    bl = align_blocks(E, block_m, B_max)
    block_j = pow2(block_t * K)
    block_p = min(ALIGN_SCATTER_PAIRS, block_j)
    return {**bl, "BLOCK_M": block_m, "BLOCK_T": block_t, "BLOCK_C": scan_block(C),
            "BLOCK_EX": ALIGN_SCAN_EXPERTS, "BLOCK_CS": max(2, min(ALIGN_SCAN_CHUNKS, pow2(C))),
            "BLOCK_K": max(2, pow2(K)), "scan_grid": (cdiv(E, ALIGN_SCAN_EXPERTS),),
            "layout_grid": (cdiv(max(B_max, 1), bl["BLOCK_B"]),), "hist_grid": (C,),
            "BLOCK_P": block_p, "BLOCK_J": block_j, "scatter_grid": (C, cdiv(block_t * K, block_p)),
            "scatter_warps": ALIGN_SCATTER_WARPS, "num_warps": 4 if bl["BLOCK_E"] <= ALIGN_WARPS4_MAX_E else 8}


def act_launch(I: int, block_m: int, num_m: int) -> dict:
    """The split-K activation kernel after GEMM 1: BLOCK_N columns of I per program."""
    bn = min(128, pow2(I))
    return {"BLOCK_M": block_m, "BLOCK_N": bn, "grid": (num_m * cdiv(I, bn),), "num_warps": 4}


def combine_launch(T: int, H: int) -> dict:
    """The combine's blocks: BLOCK_T tokens x BLOCK_H columns per program."""
    block_h = min(1024, pow2(H))
    block_t = 1 if T < 256 else 4
    return {"BLOCK_T": block_t, "BLOCK_H": block_h, "grid": (cdiv(T, block_t), cdiv(H, block_h)), "num_warps": 4}


def quantize_launch(T: int, H: int, *, interpret: bool = False) -> dict:
    """The x quantization before the FP8 GEMM 1s: BLOCK_T tokens x one 128-column group per program."""
    bt = 8 if interpret else 32
    return {"BLOCK_T": bt, "KB": FP8_BLOCK, "grid": (cdiv(T, bt), cdiv(H, FP8_BLOCK)), "num_warps": 4}


def quantizes_x(config, fp8: str | None) -> bool:
    """Whether the layer quantizes x once before its FP8 GEMM 1s (FP8 activations, not weight_on_input)."""
    return fp8 == "weights+act" and not config.weight_on_input


def gemm_grid(num_m: int, N: int, cfg: dict, split: int | None = None, *, num_sms: int | None = None) -> tuple[int]:
    """Programs of a grouped GEMM launch: row blocks x N tiles x split-K (persistent: at most the SMs)."""
    tiles = num_m * cdiv(N, cfg["BLOCK_N"])
    if cfg.get("variant", "pointer") == "tma_persistent":
        if not num_sms:
            raise ValueError("gemm_grid: a persistent launch needs num_sms")
        return (max(1, min(num_sms, tiles)),)
    s = cfg.get("SPLIT_K", 1) if split is None else split
    return (tiles * s,)


@dataclass(frozen=True)
class StaticPlan:
    """Everything ``moe_forward`` launches for T tokens that does not depend on the routing: the
    GEMM configs, the launch functions' dicts (None where not launched), P_max, B_max, split2,
    atomic, KS and num_sms."""

    T: int
    gemm: dict
    shared: dict | None
    router: dict
    align: dict
    act: dict | None
    shared_act: dict | None
    combine: dict | None
    P_max: int
    B_max: int
    shared_m: int
    split2: int
    atomic: bool
    KS: int
    num_sms: int
    fp8: str | None = None  # None, "weights" (e4m3 weights, activations in x's dtype) or "weights+act"
    #: quantize_launch's dict where the layer quantizes x once before GEMM 1 (``quantizes_x``), else None
    quant: dict | None = None


def static_plan(config, T: int, *, dtype: str = "bfloat16", device_name: str = "NVIDIA H200",
                triton_version: str | None = None, deterministic: bool = True, num_sms: int | None = None,
                gemm: dict | None = None, shared_gemm: dict | None = None, fp8: str | None = None,
                router: dict | None = None, fp8_options: FP8Options | None = None) -> StaticPlan:
    """The routing-independent launch sizes of the layer (``device_name`` "cpu-interpreter" for the
    interpreter's configs). ``gemm`` / ``shared_gemm`` / ``router``: entries instead of the tuned
    ones; ``fp8``: None, "weights" or "weights+act"; ``fp8_options``: fp8_plan.FP8Options."""
    if fp8 not in FP8_MODES:
        raise ValueError(f"fp8 must be one of {list(FP8_MODES)}, got {fp8!r}")
    interpret = device_name == "cpu-interpreter"
    sms = int(num_sms or (cfgs.INTERPRETER_SMS if interpret else cfgs.DEFAULT_SMS))
    keys = [None if g is None else json.dumps(cfgs.check_entry(g, f"static_plan({what}=...)"), sort_keys=True)
            for what, g in (("gemm", gemm), ("shared_gemm", shared_gemm))]
    rkey = None if router is None else _router_key(router, config, int(T), interpret, sms)
    return _static_plan(config, int(T), dtype, device_name, triton_version or _triton_version(), bool(deterministic),
                        sms, *keys, fp8, rkey, fp8_options)


def _router_key(router: dict, config, T: int, interpret: bool, num_sms: int) -> tuple:
    """A ``router`` given to ``static_plan``, checked against the default and made hashable."""
    E, K, H = config.num_experts, config.top_k, config.hidden_size
    default = router_launch(T, E, H, K, config.n_group, interpret=interpret, num_sms=num_sms)
    if set(router) != set(default):
        raise ValueError(f"static_plan(router=...): want the keys of router_launch {sorted(default)}, "
                         f"got {sorted(router)}")
    for k in ("BLOCK_T", "C", "grid"):
        if tuple(np.atleast_1d(router[k])) != tuple(np.atleast_1d(default[k])):
            raise ValueError(f"static_plan(router=...): {k}={router[k]} is not the layer's {default[k]} "
                             "(the align and its buffers are sized from the router's chunks)")
    return tuple(sorted((k, tuple(int(x) for x in v) if isinstance(v, (list, tuple)) else v)
                        for k, v in router.items()))


def _gemm_entry(E, H, I, K, T, dtype, device_name, tv, interpret, given_json, fp8=None, x_once=True,
                fp8_options=None):
    if given_json is None:
        g = cfgs.select_config(E, H, I, K, T, gpu=device_name, dtype=dtype, triton_version=tv, interpret=interpret)
    else:
        g = cfgs.resolve_variants(json.loads(given_json), H, I, dtype)
    return fp8_entry(g, fp8, dtype, depths=(H, I), x_once=x_once, options=fp8_options or FP8Options())


@lru_cache(maxsize=256)
def _static_plan(config, T, dtype, device_name, tv, deterministic, num_sms, gemm_json, shared_json,
                 fp8=None, router_key=None, fp8_options=None) -> StaticPlan:
    E, K, H, I = config.num_experts, config.top_k, config.hidden_size, config.intermediate_size
    interpret = device_name == "cpu-interpreter"
    x_once = quantizes_x(config, fp8)
    g = _gemm_entry(E, H, I, K, T, dtype, device_name, tv, interpret, gemm_json, fp8, x_once, fp8_options)
    bm = g["gemm1"]["BLOCK_M"]
    shared = config.num_shared_experts > 0
    KS = K + (1 if shared else 0)
    rl = dict(router_key) if router_key else router_launch(T, E, H, K, config.n_group, interpret=interpret,
                                                           num_sms=num_sms)
    P_max = max_row_blocks(T * K, E, bm) * bm
    B_max = P_max // bm
    al = align_launch(rl["C"], K, E, rl["BLOCK_T"], bm, B_max)
    act = act_launch(I, bm, B_max) if g["gemm1"].get("SPLIT_K", 1) > 1 else None
    split2 = g["gemm2"].get("SPLIT_K", 1)
    sg, shared_act, shared_m = None, None, 0
    if shared:
        Is = config.shared_intermediate_size
        sg = _gemm_entry(1, H, Is, 1, T, dtype, device_name, tv, interpret, shared_json, fp8, x_once, fp8_options)
        sg2 = dict(sg["gemm2"], SPLIT_K=split2)
        if split2 > 1:  # the shared GEMM 2 writes the routed one's split slabs: the pointer kernel
            sg2["variant"] = "pointer"
        sg = {"gemm1": sg["gemm1"], "gemm2": sg2}
        shared_m = cdiv(T, sg["gemm1"]["BLOCK_M"]) if T else 0
        if sg["gemm1"].get("SPLIT_K", 1) > 1:
            shared_act = act_launch(Is, sg["gemm1"]["BLOCK_M"], shared_m)
    atomic = not deterministic and (KS > 1 or split2 > 1)
    combine = combine_launch(T, H) if (atomic or KS > 1 or split2 > 1) and T else None
    quant = quantize_launch(T, H, interpret=interpret) if x_once and T else None
    return StaticPlan(T=T, gemm=g, shared=sg, router=rl, align=al, act=act, shared_act=shared_act, combine=combine,
                      P_max=P_max, B_max=B_max, shared_m=shared_m, split2=split2, atomic=atomic, KS=KS,
                      num_sms=num_sms, fp8=fp8, quant=quant)
