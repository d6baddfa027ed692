"""benchmarks/predict_variants.py: the cost model's variant predictions, written before a GPU run."""

from __future__ import annotations

from benchload import load_benchmark


def test_predicts_each_variant_beside_the_default(capsys):
    mod = load_benchmark("predict_variants")
    assert mod.main(["--presets", "qwen3-30b-a3b", "--tokens", "1,64", "--variants", "slice,rsplit32"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2
    assert "slice" in lines[0] and "rsplit32" in lines[0]  # T = 1: both apply
    assert "slice" not in lines[1]  # T = 64 has no expert_slice layout: the variant equals the default
    assert float(lines[0].split("default ")[1].split(" us")[0]) > 0
