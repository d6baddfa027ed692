"""megamoe.results: stored rows read back as notebooks use them."""

from __future__ import annotations

import json

import pytest

from megamoe.results import load_rows, megakernel_ratios, trace_phases


def test_ratios_and_phases_from_rows(tmp_path):
    p = tmp_path / "rows.jsonl"
    rows = [{"preset": "a", "T": 1, "routing": "uniform", "floor_us": 10.0, "megakernel_us": 20.0, "multi_us": 30.0},
            {"preset": "a", "T": 8, "floor_us": 10.0, "megakernel_us": 20.0}]  # multi missing: left out
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = megakernel_ratios(load_rows(p))
    assert got == [{"preset": "a", "T": 1, "routing": "uniform", "megakernel_over_floor": 2.0,
                    "multi_over_megakernel": 1.5}]
    tr = {"default": {"trace": {"kinds": {"gemm1": {"tasks": 3, "first_start_us": 1.0, "last_end_us": 5.0,
                                                    "mean_us": 2.0}}}}}
    assert trace_phases(tr) == [{"kind": "gemm1", "tasks": 3, "start_us": 1.0, "end_us": 5.0, "mean_us": 2.0}]


def test_missing_file_is_named():
    with pytest.raises(FileNotFoundError, match="no-such.jsonl"):
        load_rows("no-such.jsonl")


def test_machine_names_cpu_cores_platform():
    from megamoe.results import machine

    m = machine()
    assert set(m) == {"cpu", "cores", "platform"} and m["cores"] >= 1 and m["cpu"]
