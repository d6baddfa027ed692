"""Run a SPEC's points on Dask (a ``LocalCluster``, or an existing scheduler) in batches grouped by
workload, each finished batch stored at once; ``workers=0`` runs in this process."""

from __future__ import annotations

import logging
import math
import time
from collections import OrderedDict
from pathlib import Path

from .progress import Progress
from .spec import Point, Spec
from .store import Store
from .worker import run_batch, workload_key

#: Largest batch: event points (about 0.1 to 1 s each on NVL72) and analytic points (tens of us).
EVENT_BATCH = 16
ANALYTIC_BATCH = 5000
COMPACT_EVERY_S = 30.0


def batches(points: list[Point], workers: int = 1) -> list[list[Point]]:
    """Points grouped by workload, in grid order, cut into batches of at most the sizes above."""
    groups: OrderedDict[str, list[Point]] = OrderedDict()
    for p in points:
        groups.setdefault(workload_key(p), []).append(p)
    out = []
    for key, group in groups.items():
        size = ANALYTIC_BATCH if '"analytic": true' in key else EVENT_BATCH
        n = math.ceil(len(group) / size)
        step = math.ceil(len(group) / n)
        out += [group[i:i + step] for i in range(0, len(group), step)]
    return out


def connect(workers: int, scheduler: str | None):
    """(client, cluster or None); the cluster's processes run one thread each."""
    from distributed import Client, LocalCluster

    if scheduler:
        return Client(scheduler, timeout="15s"), None
    cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None,
                           silence_logs=logging.ERROR)
    return Client(cluster), cluster


def execute(spec: Spec, out: str | Path, *, workers: int = 2, scheduler: str | None = None,
            retry_failed: bool = False, progress: Progress | None = None) -> dict:
    """Run the points of ``spec`` not yet in ``out``; returns counts {total, skipped, ran, failed, interrupted}."""
    store = Store(out)
    store.compact()  # fold in what an interrupted run left as parts
    points = spec.points()
    done = store.done(retry_failed=retry_failed)
    todo = [p for p in points if p.point_id not in done]
    counts = {"total": len(points), "skipped": len(points) - len(todo), "ran": 0, "failed": 0, "interrupted": False}
    bar = progress or Progress(len(todo), skipped=counts["skipped"], enabled=False)
    bar.total, bar.skipped = len(todo), counts["skipped"]
    if not todo:
        return counts

    def take(rows: list[dict]) -> None:
        store.append(rows)
        failed = sum(r["error"] is not None for r in rows)
        counts["ran"] += len(rows)
        counts["failed"] += failed
        bar.update(len(rows) - failed, failed)

    bar.start()
    last_compact = time.perf_counter()
    client = cluster = None
    try:
        if workers == 0 and not scheduler:
            for b in batches(todo):
                take(run_batch(b))
        else:
            from distributed import as_completed

            client, cluster = connect(workers, scheduler)
            pending = {}
            for i, b in enumerate(batches(todo, workers)):
                fut = client.submit(run_batch, b, pure=False, key=f"megamoe-sweep-{i}-{b[0].point_id}")
                pending[fut.key] = (fut, b)
            for fut in as_completed([f for f, _ in pending.values()]):
                _, b = pending.pop(fut.key)
                try:
                    rows = fut.result()
                except Exception as exc:  # noqa: BLE001 - a lost worker or a task error fails its batch only
                    rows = [_failed_row(p, exc) for p in b]
                fut.release()
                take(rows)
                if time.perf_counter() - last_compact > COMPACT_EVERY_S:
                    store.compact()
                    last_compact = time.perf_counter()
    except KeyboardInterrupt:
        counts["interrupted"] = True
    finally:
        bar.close()
        if client is not None:
            client.close()
        if cluster is not None:
            cluster.close()
        store.compact()
    return counts


def _failed_row(p: Point, exc: BaseException) -> dict:
    from .worker import OUTPUTS

    c = p.canonical()
    row = {"point_id": p.point_id, "model": c["model"], "system": c["system"], **p.options, **dict.fromkeys(OUTPUTS)}
    row["error"] = f"{type(exc).__name__}: {exc}"
    return row
