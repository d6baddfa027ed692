"""Bad input to ``megamoe simulate`` (and simulate()): one line naming the value and what is allowed,
exit code 2, before any work; or the behaviour a user expects (issue 9's list, item by item)."""

from __future__ import annotations

import importlib
import json

import numpy as np
import pytest

from megamoe.cli import main
from megamoe.reference import MoEConfig
from megamoe.simulator import simulate

FAST = ["--system", "hgx-h200", "--model", "qwen3-30b-a3b", "--tokens-per-gpu", "16"]


@pytest.fixture
def no_work(monkeypatch):
    """Fail the test if the workload is built: the error must come first."""
    sim = importlib.import_module("megamoe.simulator.simulate")  # the module, not the function

    def refuse(*a, **k):
        raise AssertionError("the workload was built before the bad input was refused")

    monkeypatch.setattr(sim, "build_workload", refuse)


def _refused(capsys, argv, match):
    rc = main(["simulate", *argv])
    err = capsys.readouterr().err
    assert rc == 2, err
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert match in lines[0], lines[0]


# argv after FAST -> words the one error line must hold; each case is one item of the issue
REFUSED = {
    "comm_sms_0_analytic": (["--comm-sms", "0", "--analytic"], "comm_sms must be a whole number in [1, 131]"),
    "comm_sms_500_analytic": (["--comm-sms", "500", "--analytic"], "got 500"),
    "comm_sms_minus_3_analytic": (["--comm-sms", "-3", "--analytic"], "got -3"),
    "comm_sms_500_bulk": (["--comm-sms", "500", "--schedule", "bulk"], "got 500"),
    "minibatch_0": (["--minibatch", "0"], "minibatch must be a whole number of tokens >= 1"),
    "slots_without_eplb": (["--slots", "160"], "applies to the eplb placement only; placement 'contiguous'"),
    "links_without_json": (["--links"], "--links adds every link's bytes to the JSON output: use it with --json"),
    "analytic_with_trace": (["--analytic", "--trace", "t.json"], "--trace needs the event model's timeline"),
    "seed_minus_1": (["--seed", "-1"], "seed must be a whole number in [0, 2^32), got -1"),
    "tokens_0": (["--tokens-per-gpu", "0"], "tokens_per_gpu must be a whole number >= 1, got 0"),
    "eplb_too_few_slots": (["--placement", "eplb", "--slots", "10"], "eplb: num_slots=10 must be >= num_experts=128"),
    "comm_work_unknown": (["--comm-work", "quantize,bogus"], "comm_work must be among ('quantize', 'transpose', "
                                                             "'stash'), got ['bogus']"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_refused_before_any_work(case, capsys, no_work):
    argv, match = REFUSED[case]
    _refused(capsys, FAST + argv, match)


@pytest.fixture
def small_machine(monkeypatch):
    """24 GB free, as on the CI machine (the guard reads MemAvailable)."""
    sim = importlib.import_module("megamoe.simulator.simulate")  # the module, not the function

    monkeypatch.setattr(sim, "available_memory_bytes", lambda: 24e9)


def test_size_guard_ten_million_tokens(capsys, no_work, small_machine):
    """10 million tokens per GPU on NVL72 was a MemoryError: now refused with pairs, memory and what fits."""
    _refused(capsys, ["--tokens-per-gpu", "10000000"], "5.76e+09 token-expert pairs need about 634 GB to build and "
                                                       "this machine has 24 GB free; at most about 303,030 tokens per GPU fit")


def test_size_guard_one_million_tokens_analytic(capsys, no_work, small_machine):
    """1 million tokens per GPU, --analytic, ran a minute with no output: refused at once here."""
    _refused(capsys, ["--tokens-per-gpu", "1000000", "--analytic"], "5.76e+08 token-expert pairs need about 63 GB")


def test_long_run_reports_size_and_progress(monkeypatch, capsys):
    """A build estimated over LONG_RUN_S says how long and how big first, then reports each stage
    (the reference router per tenth of the tokens)."""
    sim = importlib.import_module("megamoe.simulator.simulate")  # the module, not the function

    monkeypatch.setattr(sim, "LONG_RUN_S", 0.0)
    assert main(["simulate", *FAST, "--routing", "router", "--analytic"]) == 0
    err = capsys.readouterr().err
    assert "a large workload: 1,024 token-expert pairs, about" in err
    assert "routing 128 tokens (router)" in err and "dispatch plan" in err and "workload built in" in err


def test_trace_into_missing_directory(tmp_path, capsys, no_work):
    _refused(capsys, FAST + ["--trace", str(tmp_path / "nope" / "t.json")], "does not exist")
    _refused(capsys, FAST + ["--trace", str(tmp_path)], "is a directory")


def test_system_is_a_directory(tmp_path, capsys):
    _refused(capsys, ["--system", str(tmp_path)], "is a directory; --system takes a profile name")


def test_corrupt_npz_trace_names_the_file(tmp_path, capsys):
    f = tmp_path / "r.npz"
    f.write_bytes(b"not a zip at all")
    _refused(capsys, FAST + ["--routing", f"trace:{f}"], f"{f}: not a readable .npz archive")
    g = tmp_path / "one.npz"
    with g.open("wb") as fh:
        np.save(fh, np.zeros((128, 8), np.int64))  # an .npy under an .npz name
    _refused(capsys, FAST + ["--routing", f"trace:{g}"], "is a single .npy array")


def test_model_file_errors_name_the_file(tmp_path, capsys):
    f = tmp_path / "cfg.json"
    f.write_text(json.dumps({"model_type": "mixtral", "hidden_size": 8}))
    _refused(capsys, ["--model", str(f)], f"{f}: config (model_type 'mixtral'): missing required field")


def test_strict_json_and_no_infinity(capsys):
    """--json is strict JSON: a non-finite number would be null, never Infinity."""
    from megamoe.simulator.simulate import _plain

    assert _plain({"a": float("inf"), "b": [np.nan, 1.0]}) == {"a": None, "b": [None, 1.0]}
    assert main(["simulate", *FAST, "--analytic", "--json"]) == 0
    out = capsys.readouterr().out
    json.loads(out, parse_constant=lambda c: pytest.fail(f"non-strict JSON constant {c}"))


def test_analytic_table_shows_dispatch_and_combine(capsys):
    """--analytic's dispatch and combine are the phases' own bounds, not 0.0."""
    r = simulate("qwen3-30b-a3b", "hgx-h200", 64, routing="uniform", analytic_only=True)
    full = simulate("qwen3-30b-a3b", "hgx-h200", 64, routing="uniform")
    for k in ("dispatch", "combine"):
        assert 0 < r.breakdown_us[k] <= full.breakdown_us[k] * (1 + 1e-9), k
    assert main(["simulate", *FAST, "--analytic"]) == 0
    assert "bound of the phase alone" in capsys.readouterr().out


@pytest.mark.parametrize("name", ["mixtral-8x7b", "gpt-oss-20b"])
def test_default_skew_runs_every_preset(name, capsys):
    """The default skewed routing clamps 10.9 to what E/K allows, and says so (two presets needed it)."""
    cfg = MoEConfig.preset(name)
    want = {"mixtral-8x7b": 2.0, "gpt-oss-20b": 6.0}[name]
    assert main(["simulate", "--model", name, "--system", "hgx-h200", "--tokens-per-gpu", "32", "--json"]) == 0
    cap = capsys.readouterr()
    d = json.loads(cap.out)
    assert d["inputs"]["routing"] == f"skewed:{want:g}"
    assert f"using skewed:{want:g}" in cap.err and f"E={cfg.num_experts}, K={cfg.top_k}" in cap.err
    assert d["inputs"]["notes"]


def test_default_skew_is_unchanged_where_it_fits():
    from megamoe.reference import PRESETS
    from megamoe.simulator.workload import default_skew

    for name in PRESETS:
        c = MoEConfig.preset(name)
        r = default_skew(c.num_experts, c.top_k)
        assert 0 <= r < c.num_experts / c.top_k - 1
        if c.num_experts / c.top_k - 1 > 11.9:
            assert r == 10.9, name
    with pytest.raises(ValueError, match=r"imbalance ratio 10.9 must be in \[0, 3\)"):  # explicit R: no clamp
        simulate("mixtral-8x7b", "hgx-h200", 8, routing="skewed:10.9", analytic_only=True)


def test_implausible_profile_number_warns(capsys):
    """A link of 50 bytes/s (a GB/s slip) runs, with a warning naming the key, value and the usual range."""
    assert main(["simulate", *FAST, "--link-bandwidth", "50", "--analytic"]) == 0
    err = capsys.readouterr().err
    assert "warning: link.bandwidth_per_direction_bytes_per_s = 50 bytes/s is far outside" in err


def test_shipped_profiles_are_plausible():
    from megamoe.simulator.hardware import available_profiles, load_profile, plausibility_warnings

    for name in available_profiles():
        assert plausibility_warnings(load_profile(name)) == [], name
