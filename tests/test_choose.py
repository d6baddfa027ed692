"""The cost model's choice of launch configs and backend (megamoe.choose), the model tables it
writes (megamoe configure) and the order the kernels read them in (tuned, model, heuristic)."""

from __future__ import annotations

import json
import math

import pytest

from megamoe.choose import TIE_REL, _pick, choose, routing_counts, tie_key, uniform_counts
from megamoe.cli import main
from megamoe.kernels import configs as cfgs
from megamoe.reference import MoEConfig
from megamoe.tune_tables import TABLE_PRESETS, build_table

H100_GPU = "NVIDIA H100 80GB HBM3"


def test_uniform_counts_spread_the_pairs_evenly():
    for E, T, K in ((128, 1, 8), (8, 13, 2), (256, 4096, 8), (7, 0, 3)):
        c = uniform_counts(E, T, K)
        assert c.sum() == T * K and c.max() - c.min() <= 1 and len(c) == E
        k = routing_counts("concentrated", E, T, K)
        assert k.sum() == T * K and (k[:K] == T).all()
    with pytest.raises(ValueError, match="routing must be one of"):
        routing_counts("zipf", 8, 1, 2)


def test_price_counts_the_skewed_routing():
    """Qwen3-30B-A3B at T = 512 on the H100: 16-row tiles win on the uniform routing alone, the
    price over both routings takes wider row tiles, which the concentrated routing needs."""
    from megamoe.choose import _Pricer

    cfg = MoEConfig.preset("qwen3-30b-a3b")
    c = choose(cfg, 512, "h100", megakernel=False)
    assert c.entry["gemm1"]["BLOCK_M"] >= 32
    sixteen = cfgs.resolve_variants(cfgs.default_config(128, 2048, 768, 8, 1), 2048, 768, "bfloat16")
    from megamoe.simulator.hardware import load_profile

    p = load_profile("h100")
    uni, conc = (_Pricer(cfg, 512, p, "bfloat16", r) for r in ("uniform", "concentrated"))
    assert uni(sixteen) < uni(c.entry) and conc(sixteen) > 2 * conc(c.entry)


@pytest.mark.parametrize("profile", ["h100", "benchmarks/results/h200/validation/profile.json"])
def test_choice_is_a_valid_candidate_entry_for_every_bench_preset_and_bucket(profile):
    """Each (preset, bucket): an entry the kernels' loader accepts, made of candidates, finite
    predictions, and the entry's price no higher than any other it priced (up to a tie)."""
    from megamoe.tune_tables import load

    prof = load(profile)
    for name in TABLE_PRESETS:
        cfg = MoEConfig.preset(name)
        E, H, I, K = cfg.num_experts, cfg.hidden_size, cfg.intermediate_size, cfg.top_k
        for T in cfgs.T_BUCKETS:
            c = choose(cfg, T, prof, megakernel=False)
            assert cfgs.check_entry(c.entry, f"{name} T={T}") == c.entry
            cands = cfgs.candidates(E, H, I, K, T)
            assert c.entry["gemm1"] in cands["gemm1"] and c.entry["gemm2"] in cands["gemm2"]
            assert c.price["multi"] <= min(us for us, _ in c.ranking) * (1 + TIE_REL)
            assert math.isfinite(c.predicted_us) and c.predicted_us > 0


@pytest.mark.parametrize("T", [1, 512])
def test_backend_is_the_lower_price(T):
    """The megakernel where its price (us over both routings) is lower than the multi-launch path's."""
    c = choose(MoEConfig.preset("qwen3-235b-a22b"), T, "h100")
    assert set(c.price) == {"multi", "megakernel"} and math.isfinite(c.megakernel_us)
    assert (c.backend == "megakernel") == (c.price["megakernel"] < c.price["multi"] * (1 - TIE_REL))


def test_ties_go_to_the_heuristics_config_whatever_the_list_order():
    """Equal predictions: the config nearest the heuristic's wins, in either order of the list."""
    heur = cfgs.default_config(128, 2048, 768, 8, 1)
    near = {"gemm1": dict(heur["gemm1"], num_stages=3), "gemm2": heur["gemm2"]}
    far = {"gemm1": dict(heur["gemm1"], num_stages=2, BLOCK_K=64), "gemm2": heur["gemm2"]}
    for priced in ([(10.0, far), (10.0, near)], [(10.0, near), (10.0, far)]):
        assert _pick(priced, heur, "gemm1")[1] is near
    assert _pick([(10.0, near), (9.0, far)], heur, "gemm1")[1] is far  # a real difference is no tie
    assert tie_key(heur["gemm1"], heur["gemm1"])[0] == 0


def test_choose_refuses_t_zero_and_skips_the_megakernel_when_asked():
    cfg = MoEConfig.preset("qwen3-30b-a3b")
    with pytest.raises(ValueError, match="T must be >= 1"):
        choose(cfg, 0, "h100")
    c = choose(cfg, 1, "h100", megakernel=False)
    assert c.backend == "multi" and c.megakernel_us is None and c.best_us == c.predicted_us


@pytest.mark.parametrize("profile, preset", [("h100", "mixtral-8x7b"), ("h200", "qwen3-30b-a3b")])
def test_shipped_tables_equal_what_configure_regenerates(profile, preset):
    """The shipped model table of a profile holds what `megamoe configure` makes today from the
    profile its source names (one preset regenerated): a change to the model or the candidates
    that changes a choice fails here until the tables are regenerated."""
    path = cfgs.model_path(profile, "bfloat16")
    shipped = json.loads(path.read_text())
    assert cfgs.load_file(path, model=True)  # the kernels' loader accepts it
    assert set(TABLE_PRESETS) <= set(shipped["source"]["presets"])
    fresh = build_table(shipped["source"]["profile"], [preset])
    key = next(iter(fresh["configs"]))
    for part in ("configs", "backend", "predicted_us"):
        assert fresh[part][key] == shipped[part][key], part
    assert shipped["gpu"] == profile and "candidate entries" in shipped["source"]["chosen_by"]


@pytest.fixture
def tables(tmp_path, monkeypatch):
    """A fake GPU with a tuned file (T=1 bucket of one shape) and a model table (buckets 1 and 4096)."""
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "families.json").write_text(json.dumps({"devices": {"Fake GPU": "fake"}}))
    mk = lambda bm, bn: {g: dict(cfgs.GEMM_OPTIONAL, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=64, GROUP_M=8,  # noqa: E731
                                 num_warps=4, num_stages=3) for g in ("gemm1", "gemm2")}
    (model_dir / "fake__bfloat16.json").write_text(json.dumps({
        "gpu": "fake", "dtype": "bfloat16", "triton": "any", "source": {}, "predicted_us": {},
        "configs": {"E8_H64_I32_K2": {"1": mk(16, 32), "4096": mk(64, 32)}},
        "backend": {"E8_H64_I32_K2": {"1": "megakernel", "4096": "multi"}}}))
    tuned = tmp_path / "tuned.json"
    tuned.write_text(json.dumps({"gpu": "Fake GPU", "dtype": "bfloat16", "triton": "t",
                                 "configs": {"E8_H64_I32_K2": {"1": mk(16, 128)}, "E4_H64_I32_K2": {"8": mk(32, 64)}},
                                 "backend": {"E8_H64_I32_K2": {"1": "multi"}}}))
    monkeypatch.setattr(cfgs, "MODEL_DIR", model_dir)
    monkeypatch.setattr(cfgs, "config_path", lambda *a: tuned)
    caches = (cfgs.families, cfgs._model, cfgs._model_backends, cfgs._tuned, cfgs._backends)
    for c in caches:
        c.cache_clear()
    yield dict(gpu="Fake GPU", dtype="bfloat16", triton_version="t")
    for c in caches:
        c.cache_clear()


def test_tuned_beats_model_beats_heuristic(tables):
    """The tuned entry at its own bucket, the model's elsewhere (even where a tuned neighbour
    bucket exists), a tuned neighbour where the model has no table, else the heuristic."""
    def at(E, T):
        return (cfgs.select_config(E, 64, 32, 2, T, **tables)["gemm1"]["BLOCK_N"],
                cfgs.config_source(E, 64, 32, 2, T, **tables))

    assert at(8, 1) == (128, "tuned")
    assert at(8, 8) == (32, "model")         # nearest model bucket 1; the tuned T=1 entry is not this bucket's
    assert at(8, 5000) == (32, "model") and cfgs.select_config(8, 64, 32, 2, 5000, **tables)["gemm1"]["BLOCK_M"] == 64
    assert at(4, 64) == (64, "tuned")        # no model table for the shape: the tuned neighbour bucket
    assert at(16, 1)[1] == "heuristic"
    assert cfgs.select_config(16, 64, 32, 2, 1, **tables) == cfgs.resolve_variants(
        cfgs.default_config(16, 64, 32, 2, 1), 64, 32, "bfloat16")
    assert cfgs.config_source(8, 64, 32, 2, 1, interpret=True, **tables) == "heuristic"
    assert cfgs.untuned_config(8, 64, 32, 2, 1, gpu="Fake GPU")["gemm1"]["BLOCK_N"] == 32
    back = lambda T: (cfgs.select_backend(8, 64, 32, 2, T, **tables), cfgs.backend_source(8, 64, 32, 2, T, **tables))  # noqa: E731
    assert back(1) == ("multi", "tuned") and back(8) == ("megakernel", "model") and back(4096) == ("multi", "model")
    assert cfgs.backend_source(16, 64, 32, 2, 1, **tables) == "heuristic"


def test_unknown_device_has_no_model_table(tables):
    assert cfgs.family_of("Other GPU") is None
    assert cfgs.config_source(8, 64, 32, 2, 8, gpu="Other GPU", dtype="bfloat16", triton_version="t") == "tuned"


def test_configure_writes_a_table_the_kernels_read(tmp_path, capsys):
    assert main(["configure", "--profile", "h100", "--presets", "qwen3-30b-a3b", "--out", str(tmp_path)]) == 0
    d = json.loads((tmp_path / "h100__bfloat16.json").read_text())
    assert set(d["configs"]["E128_H2048_I768_K8"]) == {str(b) for b in cfgs.T_BUCKETS}
    assert d["source"]["command"].startswith("megamoe configure --profile h100")
    assert "qwen3-30b-a3b T=1:" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--profile", "h999"], "neither a shipped profile"),
    (["--presets", "nope-7b"], "unknown preset(s) ['nope-7b']"),
])
def test_configure_bad_input_is_one_clear_line(tmp_path, capsys, argv, message):
    assert main(["configure", *argv, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_configure_out_must_be_a_folder(tmp_path, capsys):
    f = tmp_path / "file"
    f.write_text("x")
    assert main(["configure", "--presets", "qwen3-30b-a3b", "--out", str(f)]) == 2
    assert "is a file; want a folder" in capsys.readouterr().err
