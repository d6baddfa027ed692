"""Predict the stored rows of a validation run again, offline, with another profile.

    megamoe validate --report DIR --repredict PROFILE [--out DIR2]

Rows written since run K carry ``counts`` (pairs per expert of the routing that ran), which is all
the launch and task plans need: each measured configuration is predicted again with PROFILE (a
profile name or a calibrated profile.json) and the report is written as for a GPU run, under a
note that says these are re-predictions of stored measurements, not predictions made before them.
A cost-model change tried this way still needs a fresh GPU run (predict, then measure) before its
figures are quoted. Rows without counts are left out and counted.
"""

from __future__ import annotations

import numpy as np


def topk_from_counts(counts, T: int, K: int) -> np.ndarray:
    """A (T, K) routing with these pairs per expert (the plans depend on the counts only): pairs in
    expert order, dealt so that each token's K experts differ when the counts allow it."""
    counts = np.asarray(counts, dtype=np.int64)
    if counts.sum() != T * K:
        raise ValueError(f"counts sum to {int(counts.sum())}, expected T*K = {T * K}")
    flat = np.repeat(np.arange(counts.size), counts)
    return flat.reshape(K, T).T.copy() if T else flat.reshape(0, K)


def repredict_rows(rows: list[dict], profile) -> tuple[list[dict], int]:
    """(rows predicted again with ``profile`` (predicted_us, stages, dominant replaced), rows left
    out for lack of counts)."""
    from megamoe.reference import MoEConfig
    from megamoe.scale import predict_config

    out, skipped = [], 0
    for r in rows:
        if "counts" not in r:
            skipped += 1
            continue
        cfg = MoEConfig.preset(r["preset"])  # the whole layer, as the GPU run's CudaLayer.config
        idx = topk_from_counts(r["counts"], int(r["T"]), cfg.top_k)
        pr = predict_config(cfg, idx, int(r["T"]), r["backend"], profile, device_name=r.get("gpu", "NVIDIA H200"),
                            calls_per_graph=int(r.get("calls_per_graph", 1)), triton_version=r.get("triton"))
        row = {k: v for k, v in r.items() if k not in ("predictions", "busy_us", "tasks", "programs")}
        row.update(pr, profile=profile.name, predictions={profile.name: {k: pr[k] for k in
                                                                         ("predicted_us", "predicted_fixed_us", "dominant")}})
        out.append(row)
    return out, skipped
