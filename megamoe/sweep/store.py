"""Where a sweep's rows live: ``DIR/results.parquet`` plus ``DIR/parts/part-*.parquet``, every write
atomic (temporary name, sync, rename). Readers see both and keep the last copy of each ``point_id``."""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

RESULTS = "results.parquet"
PARTS = "parts"


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_atomic(table, path: Path) -> None:
    import pyarrow.parquet as pq

    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    with open(tmp, "wb") as f:
        pq.write_table(table, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


class StoreError(ValueError):
    """A file of an output folder cannot be read as Parquet; the message names it."""


def _read(path: Path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.read_table(path)
    except (pa.ArrowException, OSError) as exc:
        raise StoreError(f"{path} is not a readable Parquet file ({str(exc).splitlines()[0][:120]}); "
                         "move it away to start that folder afresh") from None


class Store:
    """The rows of one output folder."""

    def __init__(self, out: str | Path):
        self.dir = Path(out)
        self.results = self.dir / RESULTS
        self.parts_dir = self.dir / PARTS

    def _parts(self) -> list[Path]:
        return sorted(self.parts_dir.glob("part-*.parquet")) if self.parts_dir.is_dir() else []

    def append(self, rows: list[dict]) -> None:
        """Write rows as one new part (atomically)."""
        import pyarrow as pa

        if not rows:
            return
        self.parts_dir.mkdir(parents=True, exist_ok=True)
        name = f"part-{time.time_ns()}-{uuid.uuid4().hex[:8]}.parquet"
        _write_atomic(pa.Table.from_pylist(rows), self.parts_dir / name)

    def _table(self):
        """(all rows, deduplicated by point_id keeping the last; the parts that went in)."""
        import pyarrow as pa

        parts = self._parts()
        tables = ([_read(self.results)] if self.results.exists() else []) + [_read(p) for p in parts]
        if not tables:
            return None, parts
        t = pa.concat_tables(tables, promote_options="permissive") if len(tables) > 1 else tables[0]
        if len(tables) > 1:
            ids = t.column("point_id").to_pylist()
            last = {pid: i for i, pid in enumerate(ids)}
            if len(last) < len(ids):
                t = t.take(sorted(last.values()))
        return t, parts

    def read(self):
        """All rows as a pandas DataFrame (empty if none)."""
        import pandas as pd

        t, _ = self._table()
        return pd.DataFrame() if t is None else t.to_pandas()

    def done(self, retry_failed: bool = False) -> set[str]:
        """point_ids already in the output (without the failed ones if ``retry_failed``)."""
        t, _ = self._table()
        if t is None:
            return set()
        ids = t.column("point_id").to_pylist()
        if not retry_failed or "error" not in t.column_names:
            return set(ids)
        return {pid for pid, err in zip(ids, t.column("error").to_pylist()) if err is None}

    def compact(self) -> int:
        """Fold the parts into results.parquet; returns the number of rows there."""
        t, parts = self._table()
        if t is None:
            return 0
        if parts:
            self.dir.mkdir(parents=True, exist_ok=True)
            _write_atomic(t, self.results)
            for p in parts:
                p.unlink(missing_ok=True)
            try:
                self.parts_dir.rmdir()
            except OSError:  # a part written meanwhile (or a stray file): leave the folder
                pass
        return t.num_rows

