"""kernels/bench.py without timing anything: the PyTorch baseline behind the "x PyTorch" column
against the float64 reference, the provenance rows record, and the CLI's refusals."""

from __future__ import annotations

import re
import shutil
import subprocess

import numpy as np
import pytest
import torch

from megamoe.reference import MoEConfig, assert_close, random_weights, round_to_dtype
from megamoe.reference import moe_forward as ref_forward

BASE = dict(hidden_size=40, intermediate_size=36, num_experts=7, top_k=3)  # rows of 16-byte multiples
#: name -> (config fields, why): every router family and both activations the baseline implements
CASES = {
    "softmax_topk": (dict(), "Mixtral/Qwen: softmax, top-k, renormalized"),
    "softmax_topk_shared_gate": (
        dict(norm_topk_prob=False, num_shared_experts=1, shared_intermediate_size=28, shared_expert_gate=True),
        "Qwen2-MoE: unnormalized, gated shared MLP"),
    "topk_softmax_swiglu": (
        dict(router="topk_softmax", router_bias=True, activation="clamped_swiglu", expert_bias=True,
             swiglu_limit=1.5), "gpt-oss: router bias, clamped swiglu that clamps, expert biases"),
    "sigmoid_grouped": (
        dict(num_experts=8, router="sigmoid_grouped_topk", n_group=4, topk_group=2, routed_scaling_factor=2.5,
             score_bias=True, num_shared_experts=1, shared_intermediate_size=20),
        "DeepSeek-V3: sigmoid, bias, group mask, scaling, shared MLP"),
    "sigmoid_top1_input": (
        dict(router="sigmoid_top1_input", top_k=1, num_shared_experts=1, shared_intermediate_size=24),
        "Llama 4: the weight scales the expert input"),
}


def _grouped_mm_works(device) -> bool:
    try:
        a = torch.zeros(4, 8, device=device.name, dtype=device.torch_dtype())
        b = torch.zeros(2, 8, 8, device=device.name, dtype=device.torch_dtype()).transpose(1, 2)
        torch._grouped_mm(a, b, offs=torch.tensor([2, 4], device=device.name, dtype=torch.int32))
        return True
    except (RuntimeError, AttributeError, NotImplementedError):
        return False


@pytest.mark.parametrize("case", list(CASES))
def test_torch_baseline_matches_reference(case, rng, device):
    """torch_route + torch_moe (the "x PyTorch" column's pipeline) compute the reference's layer."""
    from megamoe.kernels.bench import torch_moe, torch_route
    from megamoe.reference import route

    if not _grouped_mm_works(device):
        pytest.skip(f"torch._grouped_mm does not run on {device.name} in {device.dtype} here")
    cfg = MoEConfig(**{**BASE, **CASES[case][0]})
    w = random_weights(cfg, seed=int(rng.integers(1 << 30)))
    x = rng.standard_normal((13, cfg.hidden_size))
    dt = device.dtype
    wt = w.to_torch(device.name, device.torch_dtype())
    xt = device.tensor(x)
    tw, ti = torch_route(xt, wt, cfg)
    wr = w.round_to(dt)
    r = route(round_to_dtype(x, dt), wr.router_weight, cfg, router_bias=wr.router_bias, score_bias=wr.score_bias)
    if device.name == "cpu":  # float32: the selection is the reference's exactly
        np.testing.assert_array_equal(np.sort(ti.cpu().numpy(), axis=1), np.sort(r.topk_idx, axis=1))
    y = torch_moe(xt, wt, cfg)
    assert_close(y.cpu(), ref_forward(round_to_dtype(x, dt), wr, cfg), dt, f"torch baseline {case}")


# --------------------------------------------------------------------------- provenance
def test_git_state_is_a_commit_that_exists():
    from megamoe.kernels.bench import REPO, git_state

    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    s = git_state()
    assert re.fullmatch(r"[0-9a-f]{40}", s["commit"])
    assert subprocess.run(["git", "cat-file", "-e", f"{s['commit']}^{{commit}}"], cwd=REPO).returncode == 0
    diff = subprocess.run(["git", "diff", "HEAD", "--binary"], cwd=REPO, capture_output=True).stdout
    assert s["dirty"] == bool(diff)
    assert (s["diff_sha256"] is None) == (not diff)


def test_git_state_outside_a_checkout(tmp_path, monkeypatch):
    """A copied tree (the GPU machines): the commit comes from MEGAMOE_COMMIT, which must be a commit id."""
    from megamoe.kernels.bench import ProvenanceError, git_state

    monkeypatch.delenv("MEGAMOE_COMMIT", raising=False)
    assert git_state(tmp_path) == {"commit": "unknown", "dirty": None, "diff_sha256": None}
    monkeypatch.setenv("MEGAMOE_COMMIT", "bd5693b+final")
    with pytest.raises(ProvenanceError, match=r"'bd5693b\+final' is not a commit id"):
        git_state(tmp_path)
    monkeypatch.setenv("MEGAMOE_COMMIT", "8e7f517")
    monkeypatch.setenv("MEGAMOE_DIRTY", "1")
    monkeypatch.setenv("MEGAMOE_DIFF_SHA256", "ab" * 32)
    assert git_state(tmp_path) == {"commit": "8e7f517", "dirty": True, "diff_sha256": "ab" * 32}


# --------------------------------------------------------------------------- CLI
def test_bench_without_torch_says_so(monkeypatch, capsys):
    import sys

    from megamoe.cli import main

    monkeypatch.setitem(sys.modules, "torch", None)  # import torch now raises ImportError
    assert main(["bench", "--presets", "mixtral-8x7b", "--tokens", "1"]) == 2
    err = capsys.readouterr().err
    assert "megamoe bench: needs torch and triton on a CUDA GPU" in err and "Traceback" not in err


@pytest.mark.parametrize("argv, match", [
    (["--presets", "gpt-5"], "unknown preset(s) ['gpt-5']"),
    (["--tokens", "1,x"], "--tokens must be comma-separated whole numbers"),
    (["--tokens", "0"], "--tokens must list token counts >= 1"),
    (["--reps", "0"], "--reps must be >= 1"),
])
def test_bench_bad_options(argv, match, capsys):
    from megamoe.cli import main

    assert main(["bench", *argv]) == 2
    assert match in capsys.readouterr().err



@pytest.mark.parametrize("argv, match", [
    (["--dtype", "fp16"], "--dtype: unknown dtype(s) ['fp16']; choices: bf16, fp8, fp8-act"),
    (["--dtype", "bf16,fp4"], "unknown dtype(s) ['fp4']"),
    (["--dtype", ","], "--dtype: unknown dtype(s) [',']"),
    (["--dtype", "fp8,fp8"], "--dtype lists a dtype twice"),
])
def test_bench_bad_dtype(argv, match, capsys, monkeypatch):
    """Refused before torch is imported: the error lists the choices."""
    import sys

    from megamoe.cli import main

    monkeypatch.setitem(sys.modules, "torch", None)  # the check must not need torch
    assert main(["bench", *argv]) == 2
    assert match in capsys.readouterr().err


# --------------------------------------------------------------------------- fp8 rows, without a GPU
def test_fp8_floor_counts_fp8_weights_and_bf16_io():
    """fp8 rows: e4m3 weights with their block scales (reference.sizes), x and y still bf16; the FP8
    matmul rate only where the activations are FP8 too, none where it was not measured."""
    from megamoe.kernels.bench import bench_config, floor_matmul_rate, floor_terms
    from megamoe.reference.sizes import expert_bytes, layer_bytes, row_bytes, shared_bytes

    cfg = bench_config("deepseek-v3")
    f16, b16 = floor_terms(cfg, 8, 60.0)
    f8, b8 = floor_terms(cfg, 8, 60.0, "fp8")
    assert f8 == f16 and floor_terms(cfg, 8, 60.0, "fp8-act") == (f8, b8)
    assert b16 == layer_bytes(cfg, 8, 60.0, "bfloat16")
    E, H = cfg.num_experts, cfg.hidden_size
    want = 60.0 * expert_bytes(cfg, "fp8") + shared_bytes(cfg, "fp8") + 2 * E * H + 2 * 8 * row_bytes(H, "bf16")
    assert b8 == pytest.approx(want, rel=1e-12) and b8 < 0.51 * b16
    ceil = {"matmul_flops_per_s": 7e14, "fp8_matmul_flops_per_s": 1.3e15}
    assert floor_matmul_rate(ceil, "bf16") == ("bf16", 7e14)
    assert floor_matmul_rate(ceil, "fp8") == ("bf16", 7e14)  # weight-only FP8 multiplies in bf16
    assert floor_matmul_rate(ceil, "fp8-act") == ("fp8", 1.3e15)
    assert floor_matmul_rate({"matmul_flops_per_s": 7e14, "fp8_matmul_flops_per_s": None}, "fp8-act") == ("fp8", None)


def test_dtype_rows_pair_fp8_with_bf16_on_each_backend():
    """speedup_vs_bf16 = bf16 time / fp8 time on the same backend; a failing dtype does not lose the
    others; FP8 runs on the megakernel too."""
    from megamoe.kernels.bench import dtype_rows

    times = {"bf16": 30.0, "fp8": 20.0, "fp8-act": 15.0}

    def one(dt, backend="multi"):
        if dt == "fp8-act" and backend == "broken":
            raise RuntimeError("no")
        return {"dtype": dt, "ours_us": times[dt], "backend": backend}

    rows, logs = [], []
    dtype_rows(one, ["bf16", "fp8", "fp8-act"], rows.append, log=logs.append)
    assert [r["dtype"] for r in rows] == ["bf16", "fp8", "fp8-act"]
    assert "speedup_vs_bf16" not in rows[0]
    assert rows[1]["speedup_vs_bf16"] == pytest.approx(1.5) and rows[2]["speedup_vs_bf16"] == pytest.approx(2.0)
    assert rows[2]["bf16_us"] == 30.0 and rows[2]["bf16_backend"] == "multi"

    rows.clear()
    dtype_rows(lambda dt: one(dt, "megakernel"), ["bf16", "fp8"], rows.append, log=logs.append)
    assert rows[0]["dtype"] == "bf16"
    assert rows[1]["backend"] == "megakernel" and rows[1]["speedup_vs_bf16"] == pytest.approx(1.5)

    rows.clear()  # auto ran the megakernel for bf16, fp8 ran multi: times kept, no same-backend speedup
    dtype_rows(lambda dt: one(dt, "megakernel" if dt == "bf16" else "multi"), ["bf16", "fp8"], rows.append,
               log=logs.append)
    assert rows[1]["bf16_backend"] == "megakernel" and "speedup_vs_bf16" not in rows[1]

    rows.clear()
    dtype_rows(lambda dt: one(dt, "broken" if dt == "fp8-act" else "multi"), ["bf16", "fp8-act", "fp8"],
               rows.append, log=logs.append)
    assert [r["dtype"] for r in rows] == ["bf16", "fp8"] and "fp8-act failed: RuntimeError: no" in logs[-1]


def test_fp8_rows_print_under_their_columns():
    """dtype and x-bf16 columns right-aligned under the header; a missing floor prints as '-'."""
    from megamoe.kernels.bench import HEADER, fmt_row

    r = {"preset": "deepseek-v3", "T": 8, "dtype": "fp8-act", "floor_us": None, "ours_us": 100.0,
         "speedup_vs_bf16": 1.7}
    line = fmt_row(r)
    assert line.index("fp8-act") + len("fp8-act") == HEADER.index("dtype") + len("dtype")
    assert line.index("1.70") + len("1.70") == HEADER.index("xbf16") + len("xbf16")
    assert line.split()[3] == "-"


def test_rows_say_where_their_configs_come_from(monkeypatch):
    """config_source of the multi-launch entry (tuned at its bucket, else the model's table, else the
    heuristic; the megakernel's rules are heuristic), backend_source only where the backend was "auto";
    the printed row ends with them."""
    from megamoe.kernels import configs as cfgs
    from megamoe.kernels.bench import HEADER, config_sources, fmt_row

    cfg = MoEConfig(**BASE)
    key = cfgs.shape_key(7, 40, 36, 3)
    entry = cfgs.default_config(7, 40, 36, 3, 1)
    monkeypatch.setattr(cfgs, "_tuned", lambda gpu, dtype, tv: {key: {1: entry}} if gpu == "G" else {})
    monkeypatch.setattr(cfgs, "_model", lambda gpu, dtype: {key: {4096: entry}} if gpu == "G" else {})
    monkeypatch.setattr(cfgs, "_backends", lambda gpu, dtype, tv, fp8=None: {key: {1: "megakernel"}} if gpu == "G" else {})
    monkeypatch.setattr(cfgs, "_model_backends", lambda gpu, dtype: {})
    kw = dict(gpu="G", triton_version="t")
    assert config_sources(cfg, 1, ran="megakernel", backend="auto", **kw) == {
        "config_source": "heuristic", "backend_source": "tuned"}
    assert config_sources(cfg, 1, ran="multi", backend="auto", **kw) == {"config_source": "tuned",
                                                                        "backend_source": "tuned"}
    assert config_sources(cfg, 2048, ran="multi", backend="multi", **kw) == {"config_source": "model"}
    assert config_sources(cfg, 64, ran="multi", backend="auto", gpu="H", triton_version="t") == {
        "config_source": "heuristic", "backend_source": "heuristic"}
    assert config_sources(cfg, 1, ran="multi", backend="multi", interpret=True, **kw) == {"config_source": "heuristic"}
    r = {"preset": "p", "T": 1, "ours_us": 1.0, "backend": "multi", "config_source": "model", "backend_source": "tuned"}
    assert fmt_row(r).endswith("  model; multi by tuned") and HEADER.endswith("  configs from")
    assert fmt_row(r).index("model;") == HEADER.index("configs from")


@pytest.mark.gpu
def test_fp8_rows_on_the_gpu():
    """bench_row for every dtype on a small layer (one run, same inputs): fp8 rows run multi, carry
    their floor and a speedup over the bf16 row; the FP8 matmul ceiling measures (small n)."""
    from megamoe.kernels.bench import DTYPES, dtype_rows, fp8_matmul_rate, random_device_weights
    from megamoe.kernels.bench import bench_row as run_row
    from megamoe.kernels.fp8_weights import to_fp8

    cfg = MoEConfig(hidden_size=512, intermediate_size=384, num_experts=8, top_k=2, num_shared_experts=1,
                    shared_intermediate_size=256)
    w = random_device_weights(cfg)
    ws = {"bf16": w, "fp8": to_fp8(w)}
    ceil = {"read_bytes_per_s": 4e12, "matmul_flops_per_s": 7e14, "fp8_matmul_flops_per_s": fp8_matmul_rate(1024)}
    assert ceil["fp8_matmul_flops_per_s"] > 0
    rows = []
    dtype_rows(lambda dt: run_row("small", cfg, ws["bf16" if DTYPES[dt] is None else "fp8"], 64, ceil, reps=2,
                                  with_torch=False, backend="multi", dtype=dt), list(DTYPES), rows.append)
    assert [r["dtype"] for r in rows] == list(DTYPES)
    for r in rows[1:]:
        assert r["backend"] == "multi" and r["speedup_vs_bf16"] > 0 and r["floor_us"] > 0
        assert r["config"]["gemm1"]["BLOCK_K"] == 128  # the FP8 entry (plan.fp8_entry)
    assert rows[2]["floor_matmul"] == "fp8" and rows[1]["floor_matmul"] == "bf16"
    assert all(r["config_source"] == "heuristic" and "backend_source" not in r for r in rows)  # no table has it


def test_fmt_num_keeps_the_width_of_a_missing_figure():
    from megamoe.kernels.bench import fmt_num

    assert fmt_num(3.14159, "7.2f") == "   3.14" and fmt_num(None, "7.2f") == "      -"
    assert fmt_num(5, "5.1f") == "  5.0" and len(fmt_num("n/a", "10.1f")) == 10
