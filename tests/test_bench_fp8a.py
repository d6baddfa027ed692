"""benchmarks/bench_fp8a.py without a GPU: its arguments, its variants and (under the interpreter) one row."""

from __future__ import annotations

import pytest
import torch
from benchload import load_benchmark

from megamoe.reference import MoEConfig, random_weights


@pytest.fixture(scope="module")
def bf():
    return load_benchmark("bench_fp8a")


def test_variants_are_bf16_the_default_and_every_candidate(bf):
    from megamoe.kernels import fp8_plan

    assert list(bf.VARIANTS)[:2] == ["bf16", "fp8a"]
    assert {v: t for v, (_, t) in bf.VARIANTS.items() if t} == {
        f"fp8a_{n}": n for n in (fp8_plan.FP8A_NO_CANDIDATE, *fp8_plan.FP8A_TILE_CANDIDATES)}
    assert all(fp8 == "weights+act" for v, (fp8, _) in bf.VARIANTS.items() if v != "bf16")


def test_arguments_parse(bf):
    a = bf.parse_args(["--out", "x", "--presets", "qwen3-30b-a3b,deepseek-v3", "--tokens", "4096,16384"])
    assert a.presets == ["qwen3-30b-a3b", "deepseek-v3"] and a.tokens == [4096, 16384]
    assert a.variants == list(bf.VARIANTS) and a.reps == 10 and a.budget == 180.0
    assert bf.parse_args(["--out", "x", "--variants", "fp8a,fp8a_m128"]).variants == ["fp8a", "fp8a_m128"]


@pytest.mark.parametrize("argv", [["--presets", "gpt-5"], ["--variants", "fp8a,fp8a_m512"], ["--tokens", "4k"],
                                  ["--tokens", "0"], ["--reps", "0"], []],
                         ids=["preset", "variant", "tokens", "zero-tokens", "reps", "no-out"])
def test_bad_arguments_are_refused(bf, argv):
    with pytest.raises(SystemExit) as e:
        bf.parse_args((["--out", "x"] if argv else []) + argv)
    assert e.value.code == 2


def test_without_a_gpu_it_says_so(bf, tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: main would run the benchmark")
    assert bf.main(["--out", str(tmp_path / "o")]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


@pytest.mark.interpret
@pytest.mark.filterwarnings("ignore:invalid value encountered in matmul:RuntimeWarning")
def test_row_times_every_variant_and_checks_them(bf, monkeypatch, device):
    """One row on a tiny layer under the interpreter (its CUDA-graph timer replaced by a constant): bf16,
    the default fp8a tiles and every candidate ran the layer, the FP8 ones within the FP8 reference's
    tolerance and the candidates within a few fp32 ulps of fp8a, from plans made with the tile sets they
    name (FP8Options), which the row records."""
    if device.name != "cpu":
        pytest.skip("the GPU run is the benchmark itself")
    from megamoe.kernels import bench as kb
    from megamoe.kernels import configs as cfgs
    from megamoe.kernels.fp8_plan import FP8A_NO_CANDIDATE

    monkeypatch.setattr(kb, "graph_time_us", lambda fn, xs, reps: 100.0)
    cfg = MoEConfig(hidden_size=208, intermediate_size=144, num_experts=5, top_k=2)
    w = random_weights(cfg, seed=43)
    weights = {"bf16": w.to_torch("cpu", torch.float32), "fp8": w.to_fp8().to_torch("cpu", torch.float32)}
    r = bf.bench_row("tiny", cfg, weights, 19, list(bf.VARIANTS), reps=1, sample=5, device="cpu",
                     gemm=cfgs.tma_entry(16, interpret=True))
    c = r["candidates"]
    assert all("error" not in c[v] for v in bf.VARIANTS), c
    assert all(c[v]["ok"] for v in bf.VARIANTS if v != "bf16"), c
    assert c["fp8a"]["config"]["gemm1"]["BLOCK_M"] == 16 and c["fp8a"]["tiles"] is None
    for v, (_, tiles) in bf.VARIANTS.items():
        if tiles:
            rows = 16 if tiles == FP8A_NO_CANDIDATE else 128  # the interpreter's 16-row entry, or a candidate's
            assert c[v]["tiles"] == tiles and c[v]["config"]["gemm2"]["BLOCK_M"] == rows
            assert c[v]["max_abs_vs_fp8a"] < 1e-5, c[v]
            assert c[v]["gemm_speedup_vs_fp8a"] == {"gemm1": None, "gemm2": None}  # (constant timer: 0 us stages)
    assert c["fp8a"]["speedup_vs_bf16"] == 1.0 and "speedup_vs_fp8a" not in c["fp8a"]
    assert set(c["bf16"]["stage_us"]) == {"router+align", "gemm1", "gemm2", "combine"}
    assert bf.fmt_row(r)[0].startswith("tiny T=19")
