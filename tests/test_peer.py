"""``megamoe bench --peer FILE`` without a GPU: the peer's and megamoe's routed experts on the same
routing, checked against the float64 reference before they are timed (wall clock here), and a peer
file that cannot be compared refused with a clear error."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from megamoe.reference import MoEConfig, random_weights

FAKE = Path(__file__).parent / "data" / "fake_peer.py"
#: odd sizes (rows of 16-byte multiples), K = 3 of 7 experts: some experts get no token
CFG = MoEConfig(hidden_size=40, intermediate_size=36, num_experts=7, top_k=3)


def _layer(rng, T: int, cfg: MoEConfig = CFG):
    w = random_weights(cfg, seed=int(rng.integers(1 << 30))).to_torch("cpu", torch.float32)
    xs = [torch.from_numpy(rng.standard_normal((T, cfg.hidden_size))).float() for _ in range(2)]
    return w, xs


@pytest.mark.parametrize("T", [1, 13])
def test_fake_peer_is_timed_beside_megamoe(rng, T):
    """Both columns within float32 tolerance of the reference on the same routing, then timed."""
    from megamoe.kernels.peer import load_peer, peer_columns, wall_time_us

    w, xs = _layer(rng, T)
    row = peer_columns(CFG, w, xs, "multi", 1, load_peer(FAKE), timer=wall_time_us)
    assert row["peer_ok"] and row["experts_ok"], row
    assert row["peer_err_max"] < 1e-5 and row["experts_err_max"] < 1e-5
    assert row["peer_us"] > 0 and row["experts_us"] > 0
    assert row["speedup_vs_peer"] == pytest.approx(row["peer_us"] / row["experts_us"])
    assert row["peer_sampled_tokens"] == min(T, 4)


def test_routed_reference_is_the_reference_layer(rng):
    """The routed experts' reference on the layer's own routing equals reference.moe_forward."""
    from megamoe.kernels.peer import routed_reference
    from megamoe.reference import moe_forward, route

    w = random_weights(CFG, seed=3)
    x = rng.standard_normal((9, CFG.hidden_size))
    r = route(x, w.router_weight, CFG)
    wt = w.to_torch("cpu", torch.float64)
    rows = [0, 4, 8]
    y = routed_reference(torch.from_numpy(x), torch.from_numpy(r.topk_idx), torch.from_numpy(r.topk_weights),
                         wt.gate_up, wt.down, CFG, rows)
    want = moe_forward(x, w, CFG)[rows]
    assert abs(y - want).max() <= 1e-12 * abs(want).max()


def _peer_file(tmp_path, body: str) -> Path:
    p = tmp_path / "peer.py"
    p.write_text("import torch\n" + body)
    return p


def test_a_wrong_peer_is_reported_and_not_timed(rng, tmp_path):
    from megamoe.kernels.peer import load_peer, peer_columns, wall_time_us

    p = _peer_file(tmp_path, "def fused_experts(x, w13, w2, topk_weights, topk_ids):\n    return x * 0.5\n")
    w, xs = _layer(rng, 5)
    row = peer_columns(CFG, w, xs, "multi", 1, load_peer(p), timer=wall_time_us)
    assert row["peer_ok"] is False and "peer_us" not in row and "speedup_vs_peer" not in row
    assert "wrong output: normalized error" in row["peer_error"] and "not timed" in row["peer_error"]
    assert row["experts_ok"] and row["experts_us"] > 0


@pytest.mark.parametrize("body, match", [
    ("def fused_experts(x, w13, w2, topk_weights, topk_ids):\n    raise RuntimeError('no kernel for this GPU')\n",
     "peer fused_experts raised RuntimeError: no kernel for this GPU"),
    ("def fused_experts(x, w13, w2, topk_weights, topk_ids):\n    return x[:, :3]\n",
     r"returned shape \[5, 3\] on cpu; expected \[5, 40\] \(T, H\)"),
    ("def fused_experts(x, w13, w2, topk_weights, topk_ids):\n    return 1.0\n",
     "returned float; expected a tensor of shape"),
])
def test_a_peer_that_fails_gets_its_error_in_the_row(rng, tmp_path, body, match):
    import re

    from megamoe.kernels.peer import load_peer, peer_columns, wall_time_us

    w, xs = _layer(rng, 5)
    row = peer_columns(CFG, w, xs, "multi", 1, load_peer(_peer_file(tmp_path, body)), timer=wall_time_us)
    assert re.search(match, row["peer_error"]) and "peer_us" not in row
    assert row["experts_ok"]


@pytest.mark.parametrize("body, match", [
    (None, "no such file; give a Python file defining fused_experts(x, w13, w2, topk_weights, topk_ids)"),
    ("DIR", "is a folder; give a Python file"),
    ("\0\1binary", "importing it raised"),
    ("def experts(x):\n    return x\n", "defines no callable fused_experts"),
    ("fused_experts = 3\n", "defines no callable fused_experts"),
    ("def fused_experts(x, w13, w2):\n    return x\n", "cannot be called with the 5 arguments"),
    ("def fused_experts(x, w13, w2, topk_weights, topk_ids, config):\n    return x\n",
     "cannot be called with the 5 arguments"),
    ("raise ImportError('vllm_peer.py is missing')\n", "importing it raised ImportError: vllm_peer.py is missing"),
])
def test_bench_refuses_a_peer_it_cannot_call(tmp_path, capsys, body, match):
    """Refused before anything runs, in one line (exit 2), whatever the machine."""
    from megamoe.cli import main

    p = {None: tmp_path / "peer.py", "DIR": tmp_path}.get(body) or _peer_file(tmp_path, body)
    assert main(["bench", "--presets", "qwen3-30b-a3b", "--tokens", "1", "--peer", str(p)]) == 2
    err = capsys.readouterr().err
    assert match in err and err.startswith("megamoe bench: error: --peer") and "Traceback" not in err


def test_a_peer_without_biases_is_not_compared_on_gpt_oss(rng):
    """gpt-oss's clamped SwiGLU with expert biases is not what a peer's fused_experts computes."""
    from megamoe.kernels.peer import load_peer, peer_columns, wall_time_us

    cfg = CFG.replace(activation="clamped_swiglu", expert_bias=True, router="topk_softmax", name="tiny-oss")
    w, xs = _layer(rng, 3, cfg)
    row = peer_columns(cfg, w, xs, "multi", 1, load_peer(FAKE), timer=wall_time_us)
    assert row == {"peer_error": row["peer_error"]} and "tiny-oss has activation 'clamped_swiglu'" in row["peer_error"]


def test_the_vllm_peer_file_where_its_kernel_is_placed(rng):
    """benchmarks/peer_vllm.py over vLLM's kernel in .peer/ (git-ignored: skipped where it is not
    placed), under the interpreter: as shipped and with its alignment prepared apart, both within
    float32 tolerance of the reference; its other configs are Hopper files of this shape only."""
    from benchload import BENCH

    from megamoe.kernels.peer import load_peer_module, peer_columns, peer_output, routed_reference, routings
    from megamoe.reference import normalized_error

    if not (BENCH.parent / ".peer" / "vllm_peer.py").is_file():
        pytest.skip("vLLM's kernel is not placed in .peer/ (docs/kernels.md, 'Comparing with a peer')")
    peer = load_peer_module(BENCH / "peer_vllm.py")
    w, xs = _layer(rng, 6)
    row = peer_columns(CFG, w, xs, "multi", 1, peer.fused_experts, timer=lambda fn, ins, reps: 1.0)
    assert row["peer_ok"] and row["peer_err_max"] < 1e-5
    ((x, tw, ti),) = routings(xs[:1], w, CFG)
    cfg, source = peer.shipped_config(6, 7, 36, 40, 3)
    y = peer_output(lambda *a: peer.run(*a, cfg, peer.prepare(ti, cfg, 7)), x, w.gate_up, w.down, tw, ti)
    rows = list(range(6))
    assert normalized_error(y, routed_reference(x, ti, tw, w.gate_up, w.down, CFG, rows)).max_err < 1e-5
    assert source == "default" and peer.other_configs(6, 7, 36, 40, 3) == {}
    assert all(k.split("[")[0] in ("NVIDIA_H20", "NVIDIA_H200") for k in peer.other_configs(64, 128, 768, 2048, 8))
