"""benchmarks/repredict_runs.py and megamoe/repredict.py: stored validation rows re-predicted and
summarized (no GPU)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from benchload import load_benchmark

rr = load_benchmark("repredict_runs")
#: eight stored H200 rows and their run's profile (tests/data/cost/README.md)
STORED = Path(__file__).resolve().parent / "data" / "cost" / "h200"


def test_summary_counts_by_backend_and_threshold():
    """Median and max of |error|, rows outside 15% and 10%, each backend's median (the last key
    field is the backend, also in pooled keys that start with the run)."""
    err = {("a", 1, "u", "multi"): 0.02, ("a", 8, "u", "multi"): -0.12, ("a", 1, "u", "megakernel"): 0.20,
           ("58", "a", 8, "u", "megakernel"): -0.04}
    s = rr.summary(err)
    assert "median 8.0%" in s and "max 20.0%" in s and "outside 15% 1" in s and "outside 10% 2" in s
    assert "megakernel 12.0%" in s and "multi 7.0%" in s and "(4 rows)" in s


def test_unknown_run_names_the_runs_stored():
    with pytest.raises(SystemExit, match="no results/validation_\\*_run9999 folder; the runs stored"):
        rr.run_dir("9999")


def test_a_stored_folder_repredicts_with_its_own_profile():
    """A folder of rows and its profile: each row's error is its re-predicted time (the pinned one)
    against its measurement; the summary counts all eight."""
    assert rr.run_dir(STORED) == STORED
    err = rr.repredicted(STORED, {})
    pinned = json.loads((STORED / "pinned_us.json").read_text())
    rows = [json.loads(line) for line in (STORED / "validation.jsonl").read_text().splitlines() if line.strip()]
    want = {(r["preset"], r["T"], r["routing"], r["backend"]):
            (pinned[f"{r['preset']}:{r['T']}:{r['routing']}:{r['backend']}"] - r["measured_us"]) / r["measured_us"]
            for r in rows}
    assert err == pytest.approx(want, rel=1e-12)
    assert "(8 rows)" in rr.summary(err)


def test_options_parse_refuses_every_name_while_none_is_under_study():
    """simulator.cost.CostOptions has no field: --switch / --variant refuse any name, saying why; no
    setting is no option, no note, the default options."""
    from megamoe.repredict import parse_switches, parse_variants, switch_note, switches
    from megamoe.simulator.cost import CostOptions

    for bad in (["USE_L2_MANY_READERS=on"], ["anything=off"]):
        with pytest.raises(ValueError, match="no cost-model options are under study"):
            parse_switches(bad)
        with pytest.raises(ValueError, match="no cost-model options are under study"):
            parse_variants([",".join(bad)])
    assert parse_switches([]) == {} and parse_variants(None) == {} and switch_note({}, "x") == ()
    with switches({}) as options:
        assert options == CostOptions()


def test_options_parse_names_values_and_variants(monkeypatch):
    """With a stand-in CostOptions of two fields: NAME=on|off (1/0, true/false) per field, a variant's
    label its settings (off ones "no-"), and an unknown name, a bad value, an empty or a repeated
    variant refused by name; ``switches`` yields the options object of the settings."""
    import dataclasses

    from megamoe.repredict import parse_switches, parse_variants, switch_note, switches
    from megamoe.simulator import cost

    @dataclasses.dataclass(frozen=True)
    class Options:
        deep: bool = False
        wide: bool = True

    monkeypatch.setattr(cost, "CostOptions", Options)
    assert parse_switches(["deep=on", "wide=0"]) == {"deep": True, "wide": False}
    assert list(parse_variants(["deep=true", "deep=on,wide=off"])) == ["deep", "deep+no-wide"]
    assert switch_note({"deep": True}, "this run") == ("cost options set for this run: deep=on",)
    with switches({"deep": True}) as options:
        assert options == Options(deep=True)
    for specs, match in ((["nope=on"], "unknown cost option 'nope'; the options: deep, wide"),
                         (["deep=maybe"], "expected deep=on or deep=off")):
        with pytest.raises(ValueError, match=match):
            parse_switches(specs)
    with pytest.raises(ValueError, match="expected NAME=on"):
        parse_variants([""])
    with pytest.raises(ValueError, match="repeats the variant 'deep'"):
        parse_variants(["deep=on", "deep=1"])
