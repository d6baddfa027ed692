"""benchmarks/predict_variants.py: the cost model's variant predictions, written before a GPU run."""

from __future__ import annotations

from benchload import load_benchmark


def test_predicts_each_variant_beside_the_default(capsys):
    mod = load_benchmark("predict_variants")
    assert mod.main(["--presets", "qwen3-30b-a3b", "--tokens", "1,64", "--variants", "noreach,ptrw"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2
    assert "noreach" in lines[0] and "ptrw" in lines[0]  # T = 1: both apply
    assert "noreach" not in lines[1]  # T = 64 has no route-each layout: the variant equals the default
    assert float(lines[0].split("default ")[1].split(" us")[0]) > 0


def test_by_default_each_t_gets_the_variants_timed_there(capsys):
    """No --variants: each T gets the variants bench_megakernel.py times at that T (those that differ
    from the default config): noreach at T = 1, noaeach at T = 64."""
    mod = load_benchmark("predict_variants")
    assert mod.main(["--presets", "qwen3-30b-a3b", "--tokens", "1,64"]) == 0
    t1, t64 = capsys.readouterr().out.strip().splitlines()
    assert "T=1 " in t1 and ", noreach " in t1 and "noaeach" not in t1
    assert "T=64 " in t64 and ", noaeach " in t64 and "noreach" not in t64


def test_concentrated_routing_puts_every_token_on_the_first_k_experts(capsys, monkeypatch):
    """--routing concentrated: the counts the plans are priced at are T on experts 0..K-1 and 0
    elsewhere (as bench_megakernel.py's zeroed router gives); uniform spreads them."""
    mod = load_benchmark("predict_variants")
    seen = []
    real = mod.predict
    monkeypatch.setattr(mod, "predict", lambda cfg, counts, *a, **k: (seen.append(counts.copy()),
                                                                      real(cfg, counts, *a, **k))[1])
    assert mod.main(["--presets", "qwen3-30b-a3b", "--tokens", "64", "--variants", "noaeach",
                     "--routing", "concentrated"]) == 0
    assert "T=64 concentrated" in capsys.readouterr().out
    assert all(c[:8].tolist() == [64] * 8 and not c[8:].any() for c in seen)
    seen.clear()
    assert mod.main(["--presets", "qwen3-30b-a3b", "--tokens", "64", "--variants", "noaeach"]) == 0
    assert all((c > 0).sum() > 8 and c.sum() == 64 * 8 for c in seen)


def test_the_default_is_priced_as_every_other_tool_prices_a_megakernel_row():
    """predict() is megamoe.predict.predict_config's price of the same config (its pipeline depths
    included), on the profile given."""
    import numpy as np

    from megamoe.kernels import bench as kb
    from megamoe.kernels import megakernel_config as mkc
    from megamoe.predict import predict_config
    from megamoe.simulator.hardware import load_profile

    mod = load_benchmark("predict_variants")
    prof = load_profile("h100")
    cfg = kb.bench_config("qwen3-30b-a3b")
    counts = np.zeros(cfg.num_experts, dtype=np.int64)
    counts[[3, 9, 17, 30, 41, 77, 100, 127]] = 1
    mk = mkc.megakernel_config(cfg.num_experts, cfg.hidden_size, cfg.intermediate_size, cfg.top_k,
                               cfg.shared_intermediate_size, 1, num_sms=prof.num_sms)
    want = predict_config(cfg, counts, 1, "megakernel", prof, device_name="NVIDIA H100 80GB HBM3",
                          calls_per_graph=8, mk=mk)["predicted_us"]
    assert mod.predict(cfg, counts, 1, mk, prof, 8) == want
    assert 0 < mod.predict(cfg, counts, 1, mk, prof, 8, fp8="weights") < want  # half the weight bytes
