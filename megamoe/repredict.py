"""Predict the stored rows of a validation run again, offline, with another profile.

    megamoe validate --report DIR --repredict PROFILE [--out DIR2]

Rows written since run K carry ``counts`` (pairs per expert of the routing that ran), which is all
the launch and task plans need (``scale.predict_config`` takes them): each measured configuration
is predicted again with PROFILE (a profile name or a calibrated profile.json) and the report is
written as for a GPU run, under a note that says these are re-predictions of stored measurements, not predictions made before them.
A cost-model change tried this way still needs a fresh GPU run (predict, then measure) before its
figures are quoted. Rows without counts are left out and counted.
"""

from __future__ import annotations


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
        pr = predict_config(cfg, r["counts"], int(r["T"]), r["backend"], profile, device_name=r.get("gpu", "NVIDIA H200"),
                            calls_per_graph=int(r.get("calls_per_graph", 1)), triton_version=r.get("triton"))
        row = {k: v for k, v in r.items() if k not in ("predictions", "busy_us", "tasks", "programs")}
        row.update(pr, profile=profile.name, predictions={profile.name: {k: pr[k] for k in
                                                                         ("predicted_us", "predicted_fixed_us", "dominant")}})
        out.append(row)
    return out, skipped
