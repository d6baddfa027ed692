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
