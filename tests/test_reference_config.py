"""MoEConfig: presets carry the public shapes; bad fields give errors that name them."""

from __future__ import annotations

import json

import pytest

from megamoe.reference import PRESETS, ConfigError, MoEConfig

# (E, K, H, I, shared width) from shared/facts/moe-models.md
PUBLIC_SHAPES = {
    "mixtral-8x7b": (8, 2, 4096, 14336, 0),
    "qwen3-30b-a3b": (128, 8, 2048, 768, 0),
    "qwen3-235b-a22b": (128, 8, 4096, 1536, 0),
    "deepseek-v3": (256, 8, 7168, 2048, 2048),
    "kimi-k2": (384, 8, 7168, 2048, 2048),
    "gpt-oss-120b": (128, 4, 2880, 2880, 0),
    "gpt-oss-20b": (32, 4, 2880, 2880, 0),
    "llama4-maverick": (128, 1, 5120, 8192, 8192),
}


@pytest.mark.parametrize("name", sorted(PUBLIC_SHAPES))
def test_preset_shapes_match_public_models(name):
    c = MoEConfig.preset(name)
    assert (c.num_experts, c.top_k, c.hidden_size, c.intermediate_size, c.shared_intermediate_size) == PUBLIC_SHAPES[name]
    assert c.name == name


def test_preset_semantics():
    ds = MoEConfig.preset("deepseek-v3")
    assert (ds.router, ds.n_group, ds.topk_group, ds.routed_scaling_factor, ds.score_bias) == (
        "sigmoid_grouped_topk", 8, 4, 2.5, True)
    kimi = MoEConfig.preset("kimi-k2")
    assert (kimi.n_group, kimi.routed_scaling_factor) == (1, 2.827)
    oss = MoEConfig.preset("gpt-oss-120b")
    assert (oss.router, oss.activation, oss.router_bias, oss.expert_bias, oss.swiglu_limit) == (
        "topk_softmax", "clamped_swiglu", True, True, 7.0)
    l4 = MoEConfig.preset("llama4-maverick")
    assert l4.weight_on_input and not MoEConfig.preset("mixtral-8x7b").weight_on_input


def test_every_listed_preset_loads():
    for name in PRESETS:
        assert MoEConfig.preset(name).name == name


def test_unknown_preset_lists_known():
    with pytest.raises(ConfigError, match="unknown preset 'nope'.*mixtral-8x7b"):
        MoEConfig.preset("nope")


BAD_FIELDS = [
    (dict(top_k=9), "top_k=9 must be <= num_experts=8"),
    (dict(top_k=0), "top_k must be a positive integer"),
    (dict(hidden_size=-4), "hidden_size must be a positive integer, got -4"),
    (dict(hidden_size=4.0), "hidden_size must be a positive integer"),
    (dict(router="argmax"), "router must be one of"),
    (dict(activation="gelu"), "activation must be one of"),
    (dict(weight_dtype="int4"), "weight_dtype must be one of"),
    (dict(router="sigmoid_grouped_topk", n_group=3), "n_group=3 must divide num_experts=8"),
    (dict(router="sigmoid_grouped_topk", n_group=2, topk_group=3), "topk_group=3 must be <= n_group=2"),
    (dict(router="sigmoid_grouped_topk", n_group=4, topk_group=1, top_k=3), "top_k=3 must be <= topk_group"),
    (dict(n_group=2), "apply only to router='sigmoid_grouped_topk'"),
    (dict(score_bias=True), "score_bias applies only"),
    (dict(num_shared_experts=1), "both be 0 or both"),
    (dict(shared_expert_gate=True), "needs num_shared_experts > 0"),
    (dict(routed_scaling_factor=float("nan")), "routed_scaling_factor must be a positive finite number"),
    (dict(norm_topk_prob=1), "norm_topk_prob must be a bool"),
]


@pytest.mark.parametrize("changes,message", BAD_FIELDS, ids=[m[:30] for _, m in BAD_FIELDS])
def test_bad_field_is_named(changes, message):
    base = dict(hidden_size=16, intermediate_size=8, num_experts=8, top_k=2)
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        MoEConfig(**{**base, **changes})


def test_dict_round_trip_and_unknown_key(tmp_path):
    c = MoEConfig.preset("deepseek-v3")
    assert MoEConfig.from_dict(c.to_dict()) == c
    with pytest.raises(ConfigError, match=r"unknown MoEConfig field\(s\) \['bogus'\]"):
        MoEConfig.from_dict({**c.to_dict(), "bogus": 1})
    p = tmp_path / "layer.json"
    p.write_text(json.dumps(c.to_dict()))
    assert MoEConfig.load(p) == c
    assert MoEConfig.load("kimi-k2") == MoEConfig.preset("kimi-k2")
    with pytest.raises(ConfigError, match="neither a preset"):
        MoEConfig.load(tmp_path / "missing.json")


def test_flops_per_token():
    c = MoEConfig.preset("deepseek-v3")
    # 8 routed + 1 shared expert, 3 matrices of H x I each, 2 FLOPs per multiply-add
    assert c.flops_per_token() == 2 * 3 * 7168 * 2048 * 9


def test_random_weights_refuses_a_negative_seed():
    """NumPy's generator refuses negative seeds with a traceback of its own; the message names the argument."""
    from megamoe.reference import InputError, random_weights

    cfg = MoEConfig(hidden_size=8, intermediate_size=4, num_experts=4, top_k=2)
    for seed in (-1, 1.5, "0"):
        with pytest.raises(InputError, match=f"seed must be a non-negative integer, got {seed!r}"):
            random_weights(cfg, seed=seed)


def test_reference_modules_import_one_way():
    """No import cycle inside reference/ (every `from .x import` line, function-level ones included)."""
    import re
    from pathlib import Path

    import megamoe.reference as ref

    root = Path(ref.__file__).parent
    edges = {f.stem: set(re.findall(r"^\s*from \.(\w+) import", f.read_text(), re.M)) for f in root.glob("*.py")}
    done: set[str] = set()

    def visit(m: str, path: tuple[str, ...]) -> None:
        assert m not in path, f"import cycle: {' -> '.join(path[path.index(m):] + (m,))}"
        if m not in done:
            for n in edges.get(m, ()):
                visit(n, path + (m,))
            done.add(m)

    for m in edges:
        visit(m, ())
