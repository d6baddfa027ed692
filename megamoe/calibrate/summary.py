"""The table ``megamoe calibrate`` prints: the measured figures, one line each."""

from __future__ import annotations

from megamoe.reference.config import ROUTERS

from .compute import GEMM_FORMS
from .latency import serial_width_points


def _best_by_shape(points) -> list:
    """[((BM, BN, warps), best rate over depth)] of a tile table's points, by shape."""
    best = {}
    for bm, bn, w, _d, r in points:
        best[(bm, bn, w)] = max(best.get((bm, bn, w), 0.0), r)
    return sorted(best.items())


def hbm_deep_summary(deep: dict) -> list[str]:
    """The hbm_deep step's lines: per depth and group, TB/s at each program count for the largest
    bytes per program."""
    pts = deep.get("points", [])
    if not pts:
        return []
    b = max(p[3] for p in pts)
    progs = sorted({int(p[0]) for p in pts})
    lines = []
    for d in sorted({p[1] for p in pts}):
        for g in sorted({int(p[2]) for p in pts}):
            rates = {int(p[0]): p[4] for p in pts if p[1] == d and int(p[2]) == g and p[3] == b}
            lines.append(f"HBM deep read, {int(d) >> 10:>3} KiB in flight, g = {g}, {int(b) >> 10} KiB each, "
                         + "/".join(map(str, progs)) + " programs  "
                         + " ".join(f"{rates.get(P, 0.0) / 1e12:.2f}" for P in progs) + " TB/s")
    return lines


def sustained_summary(su: dict) -> list[str]:
    """The sustained step's lines: per graph its seconds, rate and ratio to the best, and its last
    part's rate."""
    last = {round(t1, 9): (t1 - t0, r) for t0, t1, r in su.get("marginal", [])}
    lines = []
    for (_, t, r), (_, ratio) in zip(su.get("rates", []), su.get("points", [])):
        line = f"{f'dense bf16 GEMM from idle, {t * 1e3:.0f} ms':<36} {r / 1e12:8.1f} TFLOP/s x{ratio:.3f}"
        if round(t, 9) in last:
            dt, mr = last[round(t, 9)]
            line += f", last {dt * 1e3:.0f} ms {mr / 1e12:.1f}"
        lines.append(line)
    if "recovery" in su:
        lines.append(f"{'dense bf16 GEMM, shortest graph again':<36} {su['recovery']:8.3f} of its first time's rate")
    for d in su.get("duty", []):
        mhz = d.get("sm_clock_mhz_mean")
        label = f"dense GEMM {d['duty']:.0%} of {d['seconds'] * 1e3:.0f} ms"
        lines.append(f"{label:<36} x{d['rate_ratio']:.3f} of the short rate (matmuls {d['matmul_share']:.0%} of the time)"
                     + (f", SM clock mean {mhz:.0f} MHz" if mhz else ""))
    return lines


def summary(m: dict, prof: dict) -> str:
    """The measured figures as a small table (steps not measured are left out)."""
    km = prof["kernel_model"]
    lines = ["what                                 figure"]

    def add(label, key, scale, unit, fmt="8.2f"):
        if key in km:
            lines.append(f"{label:<36} {km[key]['value'] * scale:{fmt}} {unit}")

    add("launch gap in a CUDA graph", "launch_gap_s", 1e6, "us")
    add("graph replay fixed cost", "graph_fixed_s", 1e6, "us")
    if "hbm" in m:
        lines.append(f"{'streaming read, best':<36} {prof['hbm']['bandwidth_bytes_per_s']['value'] / 1e12:8.2f} TB/s")
    add("L2 re-read", "l2_bandwidth_bytes_per_s", 1e-12, "TB/s")
    add("dense bf16 GEMM, sustained", "mma_sustained_flops_per_s", 1e-12, "TFLOP/s")
    add("flag handoff", "flag_handoff_s", 1e6, "us")
    add("grid barrier", "grid_barrier_s", 1e6, "us")
    add("ticket (one program)", "ticket_s", 1e9, "ns", "8.1f")
    add("serial load+dot step", "serial_load_step_s", 1e9, "ns", "8.1f")
    add("serial top-1 pass", "serial_reduce_step_s", 1e9, "ns", "8.1f")
    for w, t in serial_width_points(m.get("serial", {})):
        lines.append(f"{f'serial top-1 pass, {int(w)} wide':<36} {t * 1e9:8.1f} ns")
    S = prof["gpu"]["num_sms"]["value"]
    for step, key, label in (("mma", "points", "mma {} {} warps, whole GPU     "),
                             *(("gemm", f"points_{form}", f"gemm {form:<17} {{}} {{}} warps ") for form in GEMM_FORMS),
                             ("mma_fp8", "points", "mma fp8 {} {} warps, whole GPU ")):
        for (bm, bn, w), r in _best_by_shape(m.get(step, {}).get(key, [])):
            lines.append(label.format(f"{bm:>3}x{bn:<3}", w) + f" {r * S / 1e12:8.1f} TFLOP/s")
    groups = sorted({int(g) for _, g, _ in m.get("l2_shared", {}).get("points", [])})
    for P in sorted({int(p) for p, _, _ in m.get("l2_shared", {}).get("points", [])}):
        rates = {int(g): r for p, g, r in m["l2_shared"]["points"] if int(p) == P}
        lines.append(f"L2 shared read, {P:>3} programs, g = " + "/".join(str(g) for g in groups) + "  "
                     + " ".join(f"{rates.get(g, 0.0) / 1e12:.2f}" for g in groups) + " TB/s")
    lines.extend(hbm_deep_summary(m.get("hbm_deep", {})))
    for *key, t in m.get("select", {}).get("points", []):
        r, be, k, ng, bt, way = (int(x) for x in key)
        lines.append(f"{f'route select, {ROUTERS[r - 1]} E<={be} K={k} groups {ng}, {bt} tokens, ' + ('bitonic' if way == 2 else 'maxima'):<64} {t * 1e6:8.2f} us")
    lines.extend(sustained_summary(m.get("sustained", {})))
    for n, r in m.get("copy", {}).get("points", []):
        lines.append(f"gather copy, {int(n):>3} SMs, per SM          {r / 1e9:8.1f} GB/s")
    missing = prof.get("calibration", {}).get("not_measured", [])
    if missing:
        lines.append(f"not measured (the base profile's numbers kept): {', '.join(missing)}")
    return "\n".join(lines)
