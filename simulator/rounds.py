"""Where a fused layer's time goes round by round: the minibatch's terms, read off the event model.

Shape legend: G GPUs, B rounds (minibatches), P slots, C compute SMs, K top-k, H hidden, I expert width.

For the GPU that ends last, the layer splits exactly (the parts add up to its end):

    start (launch, router, top-k) + shared expert + fill (the compute SMs wait for the first round's
    rows and its signal: exposed first dispatch) + routed compute (the rounds' grouped GEMMs) + gaps
    (the compute SMs idle between the first and the last routed job: a round's rows or a free buffer
    late) + drain (after the last routed job: its pushes, the owner's reduction, the barrier: exposed
    last combine)

(bulk: one round, and its one GEMM job holds the shared expert too, so that is in routed compute.)

Beside it, per round on that GPU: the rows it receives, the output tiles of its two grouped GEMMs
(tile_m x tile_n, every expert's last row tile partial) and the waves they make over the C compute
SMs, and the completion signalling each round pays. Mixture-of-Kittens' two-wave rule
(``two_wave_rows``): a round fills two waves of the smaller GEMM from T >= 2 C tile_m tile_n / min(2I, H)
rows per rank.
"""

from __future__ import annotations

import numpy as np


def two_wave_rows(config, compute_sms: int, profile) -> float:
    """Mixture-of-Kittens' rule: rows a rank must receive per round, T = 2 C tile_m tile_n / min(2I, H)."""
    return 2.0 * compute_sms * profile.tile_m * profile.tile_n / min(2 * config.intermediate_size, config.hidden_size)


def round_tiles(rows_slot_mb: np.ndarray, config, profile) -> tuple[np.ndarray, np.ndarray]:
    """(B,) output tiles of gate/up [rows, H] x [H, 2I] and of down [rows, I] x [I, H] per round, from
    (n, B) rows per local slot and round: ceil(rows / tile_m) row tiles per slot, each full width."""
    blocks = -(-np.asarray(rows_slot_mb, np.int64) // profile.tile_m)  # (n, B)
    per = blocks.sum(axis=0)
    return (per * -(-2 * config.intermediate_size // profile.tile_n),
            per * -(-config.hidden_size // profile.tile_n))


def round_terms(spans, end_s: np.ndarray, rows_slot_mb: np.ndarray, slot_rank: np.ndarray, config, profile, *,
                compute_sms: int, signal_s: float) -> dict:
    """The split above (seconds) for the GPU that ends last, and its rounds (lists of B)."""
    g = int(np.argmax(end_s))
    mine = [s for s in spans if s.gpu == g]
    start = min((s.start_s for s in mine), default=0.0)
    shared = sum(s.end_s - s.start_s for s in mine if s.track == "compute" and s.name == "shared expert")
    jobs = [s for s in mine if s.track == "compute" and s.name.startswith(("slot", "grouped GEMMs"))]
    B = rows_slot_mb.shape[1]
    per_round = np.zeros(B)
    for s in jobs:
        m = int(s.name.rsplit("mb", 1)[1]) if "mb" in s.name else 0
        per_round[m] += s.end_s - s.start_s
    routed = float(per_round.sum())
    first = min((s.start_s for s in jobs), default=start + shared)
    last = max((s.end_s for s in jobs), default=first)
    fill = first - start - shared
    end = float(end_s[g])
    rows = rows_slot_mb[slot_rank == g]  # (n, B)
    t1, t2 = round_tiles(rows, config, profile)
    return {
        "gpu": g, "rounds": B, "end_s": end, "start_s": start, "shared_s": shared, "fill_s": fill,
        "routed_compute_s": routed, "gaps_s": last - first - routed, "drain_s": end - last,
        "signalling_s": B * signal_s, "two_wave_rows": two_wave_rows(config, compute_sms, profile),
        "round_rows": rows.sum(axis=0).tolist(), "round_compute_s": per_round.tolist(),
        "gate_up_tiles": t1.tolist(), "down_tiles": t2.tolist(),
        "gate_up_waves": (t1 / compute_sms).tolist(), "down_waves": (t2 / compute_sms).tolist(),
    }

