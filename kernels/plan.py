"""The launch plan as data: what ``moe.moe_forward`` will launch for a config and a routing.

Shape legend: T tokens, E experts, K top-k, H hidden, I expert width, Is shared width,
BM/BN/BK tile sizes, S split-K factor, C router chunks.

Pure Python and NumPy (no torch, no triton), so the simulator and validation can read it on any
machine. It makes the same choices as the launchers, through the same functions of configs.py
(tuned JSON, router blocks, split-K, padded rows), so the simulator can model the kernel that
really runs rather than a second description of it.

    plan = launch_plan(config, topk_idx=idx)            # or counts=(E,), T=...
    for st in plan.stages: st.name, st.grid, st.active_programs, st.tile, st.tiles_per_expert,
                           st.bytes_per_tile, st.flops_per_tile, st.total_bytes, st.total_flops

Bytes are DRAM-side estimates per working program (each program's operand tiles read once, its
outputs written once; what L2 saves between programs is the simulator's business); FLOPs count
the padded rows the tensor cores really compute (2 per multiply-add).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from . import configs as cfgs


@dataclass(frozen=True)
class Stage:
    """One kernel launch.

    grid: the launched grid (fixed for T: the CUDA graph replays it); active_programs: programs
    that work for this routing (the rest see block_expert = -1 and exit at once);
    tile: BLOCK_* sizes, num_warps, num_stages, SPLIT_K; tiles_per_expert: (E,) working programs
    per expert for the expert GEMMs, None elsewhere; bytes_per_tile / flops_per_tile: per working
    program; totals over the working programs.
    """

    name: str
    kernel: str
    grid: tuple[int, ...]
    active_programs: int
    tile: dict
    bytes_per_tile: float
    flops_per_tile: float
    tiles_per_expert: tuple[int, ...] | None = None
    note: str = ""
    #: expert GEMMs: bytes of one program's operands {"a": gathered rows, "b": weight tile, "out": output
    #: tile} and row blocks (E,) per expert, so that the simulator can model L2 reuse across programs
    operand_bytes_per_tile: dict | None = None
    row_blocks_per_expert: tuple[int, ...] | None = None

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
            "counts": list(self.counts), "deterministic": self.deterministic,
            "total_bytes": self.total_bytes, "total_flops": self.total_flops,
            "stages": [s.to_dict() for s in self.stages],
        }


def _triton_version() -> str:
    try:
        from importlib.metadata import version

        return version("triton")
    except Exception:  # noqa: BLE001 - triton not installed: heuristics only
        return "none"


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def launch_plan(config, T: int | None = None, *, topk_idx=None, counts=None, dtype: str = "bfloat16",
                device_name: str = "NVIDIA H200", triton_version: str | None = None,
                deterministic: bool = True) -> LaunchPlan:
    """The kernels ``moe_forward`` launches for ``config`` on T tokens routed as ``topk_idx`` (T, K)
    or as per-expert pair ``counts`` (E,) (then T is required). ``device_name`` as
    torch.cuda.get_device_name gives it ("cpu-interpreter" for the interpreter's configs)."""
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
    interpret = device_name == "cpu-interpreter"
    b = {"float32": 4, "float16": 2, "bfloat16": 2}[dtype]
    cfg = cfgs.select_config(E, H, I, K, T, gpu=device_name, dtype=dtype, triton_version=tv, interpret=interpret)
    g1, g2 = cfg["gemm1"], cfg["gemm2"]
    bm = g1["BLOCK_M"]
    shared = config.num_shared_experts > 0
    KS = K + (1 if shared else 0)
    stages: list[Stage] = []
    if T == 0:
        return LaunchPlan(config.name, 0, dtype, device_name, tv, bm, tuple(int(c) for c in counts),
                          deterministic, ())

    # ---- router (routing.py)
    bt = cfgs.router_block_t(T, E)
    C = -(-T // bt)
    block_e = max(16, _pow2(E))
    block_h = max(16, min(128, _pow2(H))) if interpret else (64 if block_e <= 128 else 32)
    split = cfgs.router_split(T, E, H, interpret=interpret)
    rtile = dict(BLOCK_T=bt, BLOCK_E=block_e, BLOCK_H=block_h, num_warps=4 if block_e <= 128 else 8)
    if split:
        h_per = _cdiv(_cdiv(H, split), block_h) * block_h
        split = -(-H // h_per)
        stages.append(Stage("router_logits", "_router_logits_kernel", (C, split), C * split, dict(rtile, SPLIT=split),
                            bytes_per_tile=(bt * h_per + E * h_per) * b + bt * E * 4,
                            flops_per_tile=2 * bt * E * h_per, note="split-H partial logits (decode)"))
        rbytes = split * bt * E * 4 + bt * K * 8
        rflops = 0.0
    else:
        rbytes = (bt * H + E * H) * b + bt * K * 8
        rflops = 2 * bt * E * H
    fused = C == 1
    P_max = cfgs.max_padded_rows(T * K, E, bm)
    B_max = P_max // bm
    stages.append(Stage("router", "_router_kernel", (C,), C, dict(rtile, FUSE_ALIGN=fused),
                        bytes_per_tile=rbytes + (8 * P_max + 4 * T * K if fused else 4 * E),
                        flops_per_tile=rflops, note="top-k; aligns too when one program holds every token"))
    if not fused:
        stages.append(Stage("align_scan", "_scan_kernel", (1,), 1, dict(BLOCK_M=bm, BLOCK_E=block_e),
                            bytes_per_tile=8 * C * E + 4 * (B_max + 2 * E), flops_per_tile=0.0))
        stages.append(Stage("align_scatter", "_scatter_kernel", (C,), C, dict(BLOCK_T=bt, BLOCK_E=block_e),
                            bytes_per_tile=bt * K * (4 + 12) + 8 * E, flops_per_tile=0.0))

    # ---- routed experts (grouped_gemm.py)
    blocks_e = -(-counts // bm)  # row blocks per expert
    active_blocks = int(blocks_e.sum())
    stages += _gemm_stages("gemm1", "gemm2", g1, g2, blocks_e, active_blocks, B_max, H, I, b, T, KS,
                           bias=config.expert_bias, deterministic=deterministic)
    split2 = g2.get("SPLIT_K", 1)

    # ---- shared MLP (dense: every token)
    if shared:
        Is = config.shared_intermediate_size
        scfg = cfgs.select_config(1, H, Is, 1, T, gpu=device_name, dtype=dtype, triton_version=tv, interpret=interpret)
        nm = -(-T // scfg["gemm1"]["BLOCK_M"])
        stages += _gemm_stages("shared_gemm1", "shared_gemm2", scfg["gemm1"], dict(scfg["gemm2"], SPLIT_K=split2),
                               np.array([nm]), nm, nm, H, Is, b, T, KS, bias=False, deterministic=deterministic)

    # ---- combine
    atomic = not deterministic and (KS > 1 or split2 > 1)
    if atomic or KS > 1 or split2 > 1:
        rows = 1 if atomic else KS * split2
        block_h = min(1024, _pow2(H))
        block_t = 1 if T < 256 else 4
        grid = (-(-T // block_t), -(-H // block_h))
        src_b = 4 if (atomic or split2 > 1) else b
        stages.append(Stage("combine", "_combine_kernel", grid, grid[0] * grid[1],
                            dict(BLOCK_T=block_t, BLOCK_H=block_h, KS=KS, SPLIT=1 if atomic else split2),
                            bytes_per_tile=block_t * block_h * (rows * src_b + b), flops_per_tile=block_t * block_h * rows,
                            note="atomic: cast only" if atomic else "fixed-order sum: deterministic"))
    return LaunchPlan(config.name, T, dtype, device_name, tv, bm, tuple(int(c) for c in counts), deterministic,
                      tuple(stages))


def _gemm_stages(n1, n2, g1, g2, blocks_e, active_blocks, num_m, H, I, b, T, KS, *, bias, deterministic):
    """GEMM 1 (+ its split-K finishing kernel) and GEMM 2 for row blocks ``blocks_e`` per expert."""
    out = []
    bm = g1["BLOCK_M"]
    s1 = g1.get("SPLIT_K", 1)
    nt1 = -(-I // g1["BLOCK_N"])
    kh = H / s1
    ops1 = {"a": bm * kh * b, "b": 2 * g1["BLOCK_N"] * kh * b,
            "out": 2 * bm * g1["BLOCK_N"] * 4 if s1 > 1 else bm * g1["BLOCK_N"] * b}
    bytes1 = ops1["a"] + ops1["b"] + ops1["out"]
    row_blocks = tuple(int(x) for x in blocks_e)
    out.append(Stage(n1, "_gemm1_kernel", (num_m * nt1 * s1,), active_blocks * nt1 * s1, dict(g1),
                     bytes_per_tile=bytes1, flops_per_tile=2 * bm * 2 * g1["BLOCK_N"] * kh,
                     tiles_per_expert=tuple(int(x) for x in blocks_e * nt1 * s1),
                     note="gather x rows; gate and up; activation in the epilogue" if s1 == 1 else "split-K partials",
                     operand_bytes_per_tile=ops1, row_blocks_per_expert=row_blocks))
    if s1 > 1:
        bn = min(128, _pow2(I))
        nta = -(-I // bn)
        out.append(Stage(n1 + "_act", "_act_kernel", (num_m * nta,), active_blocks * nta,
                         dict(BLOCK_M=bm, BLOCK_N=bn, SPLIT_K=s1),
                         bytes_per_tile=bm * bn * (2 * 4 * s1 + b), flops_per_tile=8 * bm * bn * s1,
                         tiles_per_expert=tuple(int(x) for x in blocks_e * nta)))
    s2 = g2.get("SPLIT_K", 1)
    nt2 = -(-H // g2["BLOCK_N"])
    ki = I / s2
    ob = 4 if (s2 > 1 or not deterministic) else b
    ops2 = {"a": bm * ki * b, "b": g2["BLOCK_N"] * ki * b, "out": bm * g2["BLOCK_N"] * ob}
    bytes2 = ops2["a"] + ops2["b"] + ops2["out"]
    out.append(Stage(n2, "_gemm2_kernel", (num_m * nt2 * s2,), active_blocks * nt2 * s2, dict(g2),
                     bytes_per_tile=bytes2, flops_per_tile=2 * bm * g2["BLOCK_N"] * ki,
                     tiles_per_expert=tuple(int(x) for x in blocks_e * nt2 * s2),
                     note="routing weight in the epilogue; rows to the pair buffer",
                     operand_bytes_per_tile=ops2, row_blocks_per_expert=row_blocks))
    return out


def describe(plan: LaunchPlan) -> str:
    """A short table of the plan, one line per launch."""
    lines = [f"{plan.config_name} T={plan.num_tokens} BM={plan.block_m} on {plan.device_name} (triton {plan.triton_version})"]
    for s in plan.stages:
        lines.append(f"  {s.name:<16}{s.kernel:<24} grid={s.grid!s:<14} active={s.active_programs:<7} "
                     f"MB={s.total_bytes / 1e6:9.2f} GFLOP={s.total_flops / 1e9:9.3f}")
    lines.append(f"  total MB={plan.total_bytes / 1e6:.2f} GFLOP={plan.total_flops / 1e9:.3f} launches={plan.num_launches}")
    return "\n".join(lines)
