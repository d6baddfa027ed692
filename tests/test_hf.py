"""reference/hf.py: HF config.json files into MoEConfig, HF state dicts into MoEWeights, and their errors.

The config files under tests/data/hf_configs are shaped like the public models' config.json
(README there). Expected values come from shared/facts/moe-models.md, not from the code under test.
The state dicts are written here by hand in each checkpoint convention, from canonical weights, so
a round trip checks the reading of every layout; tests/test_hf_parity.py checks the same reading
against transformers' own modules.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from megamoe.reference import ConfigError, InputError, MoEConfig, MoEWeights, moe_forward, random_weights
from megamoe.reference.hf import SUPPORTED_MODEL_TYPES, config_from_hf, read_json, weights_from_hf

CONFIGS = Path(__file__).parent / "data" / "hf_configs"


def hf_json(name: str) -> dict:
    return json.loads((CONFIGS / f"{name}.json").read_text())


# ====================================================================== configs

# file -> the MoE layer it describes (moe-models.md's table), all fields that differ from MoEConfig's defaults
EXPECTED = {
    "mixtral-8x7b": dict(hidden_size=4096, intermediate_size=14336, num_experts=8, top_k=2),
    "qwen1.5-moe-a2.7b": dict(hidden_size=2048, intermediate_size=1408, num_experts=60, top_k=4, norm_topk_prob=False,
                              num_shared_experts=1, shared_intermediate_size=5632, shared_expert_gate=True),
    "qwen3-30b-a3b": dict(hidden_size=2048, intermediate_size=768, num_experts=128, top_k=8),
    "qwen3-235b-a22b": dict(hidden_size=4096, intermediate_size=1536, num_experts=128, top_k=8),
    "deepseek-v3": dict(hidden_size=7168, intermediate_size=2048, num_experts=256, top_k=8,
                        router="sigmoid_grouped_topk", n_group=8, topk_group=4, routed_scaling_factor=2.5,
                        score_bias=True, group_mask="neg_inf", num_shared_experts=1, shared_intermediate_size=2048),
    "kimi-k2-instruct": dict(hidden_size=7168, intermediate_size=2048, num_experts=384, top_k=8,
                             router="sigmoid_grouped_topk", routed_scaling_factor=2.827, score_bias=True,
                             group_mask="neg_inf", num_shared_experts=1, shared_intermediate_size=2048),
    # greedy softmax top-6 of 64, not renormalized, 2 shared experts of 1408 fused into one of 2816
    "deepseek-v2-lite": dict(hidden_size=2048, intermediate_size=1408, num_experts=64, top_k=6, norm_topk_prob=False,
                             num_shared_experts=2, shared_intermediate_size=2816),
    "gpt-oss-20b": dict(hidden_size=2880, intermediate_size=2880, num_experts=32, top_k=4, router="topk_softmax",
                        router_bias=True, activation="clamped_swiglu", swiglu_limit=7.0, expert_bias=True),
    "gpt-oss-120b": dict(hidden_size=2880, intermediate_size=2880, num_experts=128, top_k=4, router="topk_softmax",
                         router_bias=True, activation="clamped_swiglu", swiglu_limit=7.0, expert_bias=True),
    # nested text_config; the vision tower's intermediate_size (5632) must not leak in
    "llama4-maverick": dict(hidden_size=5120, intermediate_size=8192, num_experts=128, top_k=1,
                            router="sigmoid_top1_input", num_shared_experts=1, shared_intermediate_size=8192),
}


def test_every_config_file_is_checked():
    assert sorted(p.stem for p in CONFIGS.glob("*.json")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", list(EXPECTED))
def test_config_file_maps_to_the_documented_layer(name):
    d = hf_json(name)
    want = MoEConfig(**EXPECTED[name], name=d["model_type"])  # real config.json files carry no _name_or_path
    assert config_from_hf(CONFIGS / f"{name}.json") == want
    assert config_from_hf(d) == want
    assert MoEConfig.from_hf(str(CONFIGS / f"{name}.json")) == want
    assert MoEConfig.load(CONFIGS / f"{name}.json") == want


# preset -> the config file of the same model
PRESET_FILES = {
    "mixtral-8x7b": "mixtral-8x7b", "qwen3-30b-a3b": "qwen3-30b-a3b", "qwen3-235b-a22b": "qwen3-235b-a22b",
    "qwen1.5-moe-a2.7b": "qwen1.5-moe-a2.7b", "deepseek-v3": "deepseek-v3", "kimi-k2": "kimi-k2-instruct",
    "gpt-oss-20b": "gpt-oss-20b", "gpt-oss-120b": "gpt-oss-120b", "llama4-maverick": "llama4-maverick",
}


@pytest.mark.parametrize("preset", list(PRESET_FILES))
def test_presets_agree_with_the_models_config_json(preset):
    """Same layer except the name (a preset is named by megamoe, a config.json by its model)."""
    got = config_from_hf(hf_json(PRESET_FILES[preset])).to_dict()
    want = MoEConfig.preset(preset).to_dict()
    for d in (got, want):
        d.pop("name")
    assert got == want


def test_kimi_k2_under_either_model_type_and_inside_kimi_k25():
    d = hf_json("kimi-k2-instruct")
    as_kimi = config_from_hf(d)
    assert config_from_hf({**d, "model_type": "deepseek_v3"}) == as_kimi.replace(name="deepseek_v3")
    wrapped = {"model_type": "kimi_k25", "text_config": d, "vision_config": {"hidden_size": 1152}}
    assert config_from_hf(wrapped) == as_kimi.replace(name="kimi_k25")


def test_llama4_nested_flat_and_text_only_forms_agree():
    d = hf_json("llama4-maverick")
    nested = config_from_hf(d)
    text = d["text_config"]
    assert config_from_hf(text) == nested.replace(name="llama4_text")
    flat = {**{k: v for k, v in d.items() if k not in ("text_config", "vision_config")}, **text, "model_type": "llama4"}
    assert config_from_hf(flat) == nested


def test_transformers5_field_names_are_accepted():
    """transformers 5 writes num_local_experts for Qwen3-MoE; the released config.json says num_experts."""
    d = hf_json("qwen3-30b-a3b")
    renamed = {**{k: v for k, v in d.items() if k != "num_experts"}, "num_local_experts": 128}
    assert config_from_hf(renamed) == config_from_hf(d)
    with pytest.raises(ConfigError, match=r"num_local_experts.*num_experts.*differ"):
        config_from_hf({**d, "num_local_experts": 64})


@pytest.mark.parametrize("fields, want", [
    ({"torch_dtype": "float16"}, "float16"),  # transformers 4 key
    ({"dtype": "float32", "torch_dtype": None}, "float32"),  # transformers 5 key
    ({"torch_dtype": None}, "bfloat16"),  # absent: megamoe's default
])
def test_weight_dtype_from_the_config(fields, want):
    assert config_from_hf({**hf_json("mixtral-8x7b"), **fields}).weight_dtype == want


def test_name_from_name_or_path():
    d = {**hf_json("qwen3-30b-a3b"), "_name_or_path": "Qwen/Qwen3-30B-A3B"}
    assert config_from_hf(d).name == "Qwen/Qwen3-30B-A3B"


def test_supported_model_types_are_listed():
    assert {"mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v3", "kimi_k2", "gpt_oss", "llama4",
            "llama4_text"} <= set(SUPPORTED_MODEL_TYPES)


# ---------------------------------------------------------------------- config errors


def test_read_json_missing_file(tmp_path):
    with pytest.raises(ConfigError, match=r"nope\.json.*does not exist"):
        read_json(tmp_path / "nope.json")


def test_read_json_bad_json_names_file_line_and_column(tmp_path):
    p = tmp_path / "config.json"
    p.write_text('{\n  "model_type": "mixtral",\n  "hidden_size": 4096,,\n}\n')
    with pytest.raises(ConfigError, match=r"config\.json.*not valid JSON.*line 3 column 23"):
        read_json(p)
    with pytest.raises(ConfigError, match="not valid JSON"):
        MoEConfig.load(p)


def test_read_json_not_an_object(tmp_path):
    p = tmp_path / "list.json"
    p.write_text("[1, 2]")
    with pytest.raises(ConfigError, match=r"list\.json.*must hold a JSON object, got list"):
        read_json(p)


def test_unknown_model_type_lists_the_supported_ones():
    with pytest.raises(ConfigError, match=r"model_type 'llama' is not supported; supported: .*deepseek_v3.*mixtral"):
        config_from_hf({"model_type": "llama", "hidden_size": 4096})
    with pytest.raises(ConfigError, match=r"missing required field 'model_type'; supported: "):
        config_from_hf({"hidden_size": 4096})


@pytest.mark.parametrize("name, field", [
    ("qwen3-30b-a3b", "moe_intermediate_size"),
    ("deepseek-v3", "routed_scaling_factor"),
    ("gpt-oss-20b", "num_experts_per_tok"),
    ("qwen1.5-moe-a2.7b", "shared_expert_intermediate_size"),
])
def test_missing_field_is_named(name, field):
    d = {k: v for k, v in hf_json(name).items() if k != field}
    with pytest.raises(ConfigError, match=rf"model_type '{d['model_type']}'.*missing required field '{field}'"):
        config_from_hf(d)


def test_missing_field_in_llama4_text_config_says_where():
    d = hf_json("llama4-maverick")
    d["text_config"] = {k: v for k, v in d["text_config"].items() if k != "num_local_experts"}
    with pytest.raises(ConfigError, match=r"'llama4', text_config\): missing required field 'num_local_experts'"):
        config_from_hf(d)


def test_mistyped_field_is_named():
    with pytest.raises(ConfigError, match=r"field 'num_experts_per_tok' must be an integer, got '8'"):
        config_from_hf({**hf_json("qwen3-30b-a3b"), "num_experts_per_tok": "8"})
    with pytest.raises(ConfigError, match=r"field 'norm_topk_prob' must be true or false"):
        config_from_hf({**hf_json("qwen3-30b-a3b"), "norm_topk_prob": 1})


@pytest.mark.parametrize("name, change, match", [
    # DeepSeek-V3 architecture with V2's softmax scoring or greedy top-k is another router
    ("deepseek-v3", {"scoring_func": "softmax"}, r"scoring_func='softmax' is not supported"),
    ("deepseek-v3", {"topk_method": "greedy"}, r"topk_method='greedy' is not supported"),
    # DeepSeek-V2 (236B): group-limited greedy with scale 16
    ("deepseek-v2-lite", {"topk_method": "group_limited_greedy", "routed_scaling_factor": 16.0},
     r"topk_method='group_limited_greedy' is not supported"),
    ("deepseek-v2-lite", {"routed_scaling_factor": 16.0}, r"routed_scaling_factor=16.0 .*not supported"),
    ("deepseek-v2-lite", {"norm_topk_prob": True}, r"norm_topk_prob=true .*ambiguous"),
    ("mixtral-8x7b", {"hidden_act": "gelu"}, r"hidden_act='gelu' is not supported"),
])
def test_unsupported_variants_are_refused(name, change, match):
    with pytest.raises(ConfigError, match=match):
        config_from_hf({**hf_json(name), **change})


def test_invalid_layer_is_reported_with_its_source():
    with pytest.raises(ConfigError, match=r"model_type 'mixtral'\): MoEConfig.top_k=9 must be <= num_experts=8"):
        config_from_hf({**hf_json("mixtral-8x7b"), "num_experts_per_tok": 9})


def test_config_must_be_a_dict_or_path():
    with pytest.raises(ConfigError, match="expects a dict or a path"):
        config_from_hf(42)


# ====================================================================== state dicts

# Tiny layers of each family; H != 2I except gpt-oss and Llama 4, whose fused [E, H, 2I] tensors then have
# the same shape as the standard [E, 2I, H] ones, so the layout must come from the config.
TINY = {
    "mixtral": MoEConfig.preset("mixtral-8x7b").replace(hidden_size=8, intermediate_size=6, num_experts=4),
    "qwen2_moe": MoEConfig.preset("qwen1.5-moe-a2.7b").replace(hidden_size=8, intermediate_size=6, num_experts=6,
                                                               shared_intermediate_size=10),
    "deepseek_v3": MoEConfig.preset("deepseek-v3").replace(hidden_size=8, intermediate_size=6, num_experts=16,
                                                           shared_intermediate_size=6),
    "gpt_oss": MoEConfig.preset("gpt-oss-20b").replace(hidden_size=8, intermediate_size=4, num_experts=4, top_k=2),
    "llama4": MoEConfig.preset("llama4-maverick").replace(hidden_size=8, intermediate_size=4, num_experts=4,
                                                          shared_intermediate_size=4),
}


def hf_state_dict(w: MoEWeights, cfg: MoEConfig, layout: str, prefix: str = "") -> dict[str, np.ndarray]:
    """``w`` written the way checkpoints of ``cfg``'s family store it (see docs/design.md, "Hugging Face configs and checkpoints").

    layout: "per_expert" (gate_proj/up_proj/down_proj), "mixtral" (w1/w3/w2) or "fused" (the family's 3-D tensors).
    """
    I = cfg.intermediate_size
    gate, up = w.gate_up[:, :I], w.gate_up[:, I:]  # (E, I, H) each
    router = "router" if cfg.router in ("topk_softmax", "sigmoid_top1_input") else "gate"
    sd = {f"{router}.weight": w.router_weight}
    if w.router_bias is not None:
        sd[f"{router}.bias"] = w.router_bias
    if w.score_bias is not None:
        sd[f"{router}.e_score_correction_bias"] = w.score_bias
    if layout in ("per_expert", "mixtral"):
        g, u, d = ("w1", "w3", "w2") if layout == "mixtral" else ("gate_proj", "up_proj", "down_proj")
        for e in range(cfg.num_experts):
            sd |= {f"experts.{e}.{g}.weight": gate[e], f"experts.{e}.{u}.weight": up[e],
                   f"experts.{e}.{d}.weight": w.down[e]}
    elif cfg.activation == "clamped_swiglu":  # gpt-oss: [E, H, 2I], gate in even columns, up in odd
        gu = np.empty((cfg.num_experts, cfg.hidden_size, 2 * I))
        gu[..., 0::2], gu[..., 1::2] = gate.transpose(0, 2, 1), up.transpose(0, 2, 1)
        b = np.empty((cfg.num_experts, 2 * I))
        b[:, 0::2], b[:, 1::2] = w.gate_up_bias[:, :I], w.gate_up_bias[:, I:]
        sd |= {"experts.gate_up_proj": gu, "experts.gate_up_proj_bias": b,
               "experts.down_proj": w.down.transpose(0, 2, 1), "experts.down_proj_bias": w.down_bias}
    elif cfg.router == "sigmoid_top1_input":  # Llama 4: [E, H, 2I], gate columns first
        sd |= {"experts.gate_up_proj": w.gate_up.transpose(0, 2, 1), "experts.down_proj": w.down.transpose(0, 2, 1)}
    else:  # transformers 5: [E, 2I, H], [E, H, I]
        sd |= {"experts.gate_up_proj": w.gate_up, "experts.down_proj": w.down}
    if cfg.num_shared_experts:
        Is = cfg.shared_intermediate_size
        s = "shared_experts" if cfg.router == "sigmoid_grouped_topk" else "shared_expert"
        sd |= {f"{s}.gate_proj.weight": w.shared_gate_up[:Is], f"{s}.up_proj.weight": w.shared_gate_up[Is:],
               f"{s}.down_proj.weight": w.shared_down}
        if cfg.shared_expert_gate:
            sd["shared_expert_gate.weight"] = w.shared_gate[None, :]
    return {prefix + k: v for k, v in sd.items()}


def assert_same(a: MoEWeights, b: MoEWeights) -> None:
    assert a.arrays().keys() == b.arrays().keys()
    for k, v in a.arrays().items():
        np.testing.assert_array_equal(v, getattr(b, k), err_msg=k)


ROUND_TRIPS = [  # (family, layout): every checkpoint convention each family ships in
    ("mixtral", "mixtral"), ("mixtral", "fused"),
    ("qwen2_moe", "per_expert"), ("qwen2_moe", "fused"),
    ("deepseek_v3", "per_expert"), ("deepseek_v3", "fused"),
    ("gpt_oss", "fused"),
    ("llama4", "fused"),
]


@pytest.mark.parametrize("family, layout", ROUND_TRIPS)
def test_round_trip_without_prefix(family, layout):
    cfg = TINY[family]
    w = random_weights(cfg, seed=1)
    assert_same(weights_from_hf(hf_state_dict(w, cfg, layout), cfg), w)


@pytest.mark.parametrize("family, layout", ROUND_TRIPS)
@pytest.mark.parametrize("given", ["detect", "module", "layer", "no_trailing_dot"])
def test_round_trip_with_layer_prefix(family, layout, given):
    cfg = TINY[family]
    module = {"mixtral": "block_sparse_moe", "llama4": "feed_forward"}.get(family, "mlp")
    w = random_weights(cfg, seed=2)
    sd = hf_state_dict(w, cfg, layout, prefix=f"model.layers.3.{module}.")
    sd["model.layers.3.input_layernorm.weight"] = np.ones(cfg.hidden_size)  # other tensors of the layer: ignored
    sd["model.layers.3.self_attn.q_proj.weight"] = np.ones((cfg.hidden_size, cfg.hidden_size))
    prefix = {"detect": None, "module": f"model.layers.3.{module}.", "layer": "model.layers.3.",
              "no_trailing_dot": f"model.layers.3.{module}"}[given]
    assert_same(MoEWeights.from_hf(sd, cfg, prefix=prefix), w)


def test_several_layers_need_a_prefix():
    cfg = TINY["deepseek_v3"]
    w3, w5 = random_weights(cfg, seed=3), random_weights(cfg, seed=5)
    sd = {**hf_state_dict(w3, cfg, "per_expert", "model.layers.3.mlp."),
          **hf_state_dict(w5, cfg, "per_expert", "model.layers.5.mlp."),
          "model.layers.0.mlp.gate_proj.weight": np.ones((18, 8))}  # a dense layer: not an MoE module
    with pytest.raises(InputError, match=r"2 MoE modules \('model.layers.3.mlp.', 'model.layers.5.mlp.'\); pass prefix="):
        weights_from_hf(sd, cfg)
    assert_same(weights_from_hf(sd, cfg, prefix="model.layers.5."), w5)
    with pytest.raises(InputError, match=r"2 MoE modules"):
        weights_from_hf(sd, cfg, prefix="model.layers.")


def test_torch_bf16_tensors_become_float64():
    torch = pytest.importorskip("torch")
    cfg = TINY["qwen2_moe"]
    w = random_weights(cfg, seed=4)
    sd = {k: torch.from_numpy(np.ascontiguousarray(v)).to(torch.bfloat16)
          for k, v in hf_state_dict(w, cfg, "fused").items()}
    got = weights_from_hf(sd, cfg)
    assert got.gate_up.dtype == np.float64
    assert_same(got, w.round_to("bfloat16"))


# ---------------------------------------------------------------------- state dict errors


def sd_for(family: str, layout: str = "fused", prefix: str = "") -> tuple[MoEConfig, dict]:
    cfg = TINY[family]
    return cfg, hf_state_dict(random_weights(cfg, seed=0), cfg, layout, prefix)


def test_missing_key_is_named_with_its_shape():
    cfg, sd = sd_for("qwen2_moe", "per_expert", "model.layers.1.mlp.")
    del sd["model.layers.1.mlp.experts.3.down_proj.weight"]
    with pytest.raises(InputError, match=r"missing key 'model.layers.1.mlp.experts.3.down_proj.weight' "
                                         r"\(expected shape \[8, 6\]\)"):
        weights_from_hf(sd, cfg)


def test_missing_score_bias_is_named():
    cfg, sd = sd_for("deepseek_v3")
    del sd["gate.e_score_correction_bias"]
    with pytest.raises(InputError, match=r"missing key 'gate.e_score_correction_bias' \(expected shape \[16\]\)"):
        weights_from_hf(sd, cfg)


def test_missing_experts_name_both_layouts():
    cfg, sd = sd_for("mixtral")
    del sd["experts.gate_up_proj"], sd["experts.down_proj"]
    with pytest.raises(InputError, match=r"missing expert weights.*'experts.gate_up_proj'.*'experts.0.gate_proj.weight'"):
        weights_from_hf(sd, cfg)


@pytest.mark.parametrize("key, value, match", [
    ("experts.0.gate_proj.bias", np.zeros(6), r"unexpected key\(s\) 'experts.0.gate_proj.bias'"),
    ("gate.bias", np.zeros(6), r"unexpected key\(s\) 'gate.bias'"),  # a router bias the config has not
    ("experts.6.up_proj.weight", np.zeros((6, 8)), r"'experts.6.\*': expert index 6 is out of range for num_experts=6"),
    ("experts.0.w4.weight", np.zeros((6, 8)), r"unexpected key\(s\) 'experts.0.w4.weight'"),
])
def test_extra_key_is_named(key, value, match):
    cfg, sd = sd_for("qwen2_moe", "per_expert")
    with pytest.raises(InputError, match=match):
        weights_from_hf({**sd, key: value}, cfg)


def test_misshaped_key_is_named_with_both_shapes():
    cfg, sd = sd_for("mixtral", "fused", "model.layers.0.block_sparse_moe.")
    sd["model.layers.0.block_sparse_moe.gate.weight"] = sd["model.layers.0.block_sparse_moe.gate.weight"].T
    with pytest.raises(InputError, match=r"state_dict\['model.layers.0.block_sparse_moe.gate.weight'\] must have "
                                         r"shape \[4, 8\], got \[8, 4\]"):
        weights_from_hf(sd, cfg)


def test_fused_tensor_of_another_family_is_refused():
    """A standard [E, 2I, H] gate_up under a gpt-oss config (H != 2I here) is a shape error, not a silent misread."""
    cfg = TINY["gpt_oss"].replace(hidden_size=12)
    sd = hf_state_dict(random_weights(cfg, seed=0), cfg, "fused")
    sd["experts.gate_up_proj"] = np.zeros((4, 8, 12))
    with pytest.raises(InputError, match=r"'experts.gate_up_proj'\] must have shape \[4, 12, 8\], got \[4, 8, 12\]"):
        weights_from_hf(sd, cfg)


def test_both_expert_layouts_at_once_are_refused():
    cfg, sd = sd_for("qwen2_moe", "fused")
    sd |= {k: v for k, v in hf_state_dict(random_weights(cfg), cfg, "per_expert").items() if k.startswith("experts.")}
    with pytest.raises(InputError, match="both per-expert .* and fused .* expert tensors"):
        weights_from_hf(sd, cfg)


def test_quantized_tensors_are_refused():
    cfg, sd = sd_for("gpt_oss", "fused", "model.layers.0.mlp.")
    sd["model.layers.0.mlp.experts.gate_up_proj_blocks"] = np.zeros((4, 8, 1, 16), np.uint8)
    with pytest.raises(InputError, match=r"quantized tensor 'model.layers.0.mlp.experts.gate_up_proj_blocks'.*dequantize"):
        weights_from_hf(sd, cfg)


def test_integer_tensor_is_refused():
    cfg, sd = sd_for("mixtral")
    sd["gate.weight"] = np.zeros((4, 8), np.int8)
    with pytest.raises(InputError, match=r"state_dict\['gate.weight'\] has dtype int8; expected a floating-point"):
        weights_from_hf(sd, cfg)


def test_no_moe_keys_or_wrong_prefix():
    cfg, sd = sd_for("mixtral", "fused", "model.layers.0.block_sparse_moe.")
    with pytest.raises(InputError, match=r"no MoE tensors found: expected keys like 'gate.weight'"):
        weights_from_hf({"model.embed_tokens.weight": np.zeros((4, 8))}, cfg)
    with pytest.raises(InputError, match=r"no key of the state dict starts with prefix 'model.layers.9.'"):
        weights_from_hf(sd, cfg, prefix="model.layers.9")


def test_router_under_two_names_is_refused():
    cfg, sd = sd_for("mixtral")
    with pytest.raises(InputError, match=r"both 'gate'\* and 'router'\* keys given for the router"):
        weights_from_hf({**sd, "router.weight": sd["gate.weight"]}, cfg)


def test_config_must_be_a_moeconfig():
    _, sd = sd_for("mixtral")
    with pytest.raises(InputError, match="config must be a MoEConfig"):
        weights_from_hf(sd, hf_json("mixtral-8x7b"))


# ====================================================================== FP8 checkpoints

# Sizes with a partial 128-block (H = 200 = 128 + 72) and whole ones where gate and up scales are
# stacked (I = 256, Is = 128): DeepSeek-V3's layout; Qwen2-MoE's for the shared_expert naming and its gate.
FP8 = {
    "deepseek_v3": MoEConfig.preset("deepseek-v3").replace(hidden_size=200, intermediate_size=256, num_experts=4,
                                                           n_group=2, topk_group=1, top_k=2, shared_intermediate_size=128),
    "qwen2_moe": MoEConfig.preset("qwen1.5-moe-a2.7b").replace(hidden_size=200, intermediate_size=128, num_experts=3,
                                                               top_k=2, shared_intermediate_size=128),
}


def fp8_state_dict(w8: MoEWeights, cfg: MoEConfig, layout: str, prefix: str = "") -> dict:
    """FP8 weights ``w8`` written as DeepSeek's checkpoints store them: float8_e4m3fn ``weight`` with float32
    ``weight_scale_inv`` per expert, or transformers 5's fused ``experts.*_proj`` with ``*_scale_inv``; the
    router and biases in bf16 / float32."""
    torch = pytest.importorskip("torch")

    def f8(a):
        return torch.from_numpy(np.ascontiguousarray(a)).to(torch.float8_e4m3fn)  # exact: a holds e4m3 values

    def f32(a):
        return torch.from_numpy(np.ascontiguousarray(a)).to(torch.float32)

    I, Ib = cfg.intermediate_size, cfg.intermediate_size // 128  # scale rows of the gate half
    sd = {"gate.weight": torch.from_numpy(w8.router_weight).to(torch.bfloat16)}
    if w8.score_bias is not None:
        sd["gate.e_score_correction_bias"] = f32(w8.score_bias)
    if layout == "per_expert":
        for e in range(cfg.num_experts):
            for p, v, s in (("gate_proj", w8.gate_up[e, :I], w8.gate_up_scale_inv[e, :Ib]),
                            ("up_proj", w8.gate_up[e, I:], w8.gate_up_scale_inv[e, Ib:]),
                            ("down_proj", w8.down[e], w8.down_scale_inv[e])):
                sd |= {f"experts.{e}.{p}.weight": f8(v), f"experts.{e}.{p}.weight_scale_inv": f32(s)}
    else:
        sd |= {"experts.gate_up_proj": f8(w8.gate_up), "experts.gate_up_proj_scale_inv": f32(w8.gate_up_scale_inv),
               "experts.down_proj": f8(w8.down), "experts.down_proj_scale_inv": f32(w8.down_scale_inv)}
    Is, Isb = cfg.shared_intermediate_size, cfg.shared_intermediate_size // 128
    s = "shared_experts" if cfg.router == "sigmoid_grouped_topk" else "shared_expert"
    for p, v, sc in (("gate_proj", w8.shared_gate_up[:Is], w8.shared_gate_up_scale_inv[:Isb]),
                     ("up_proj", w8.shared_gate_up[Is:], w8.shared_gate_up_scale_inv[Isb:]),
                     ("down_proj", w8.shared_down, w8.shared_down_scale_inv)):
        sd |= {f"{s}.{p}.weight": f8(v), f"{s}.{p}.weight_scale_inv": f32(sc)}
    if cfg.shared_expert_gate:
        sd["shared_expert_gate.weight"] = torch.from_numpy(w8.shared_gate[None, :]).to(torch.bfloat16)
    return {prefix + k: v for k, v in sd.items()}


@pytest.mark.parametrize("family, layout", [("deepseek_v3", "per_expert"), ("deepseek_v3", "fused"),
                                            ("qwen2_moe", "per_expert")])
def test_fp8_round_trip(family, layout, rng):
    cfg = FP8[family]
    w8 = random_weights(cfg, seed=11, fp8=True)
    b16, f32 = w8.round_to("bfloat16"), w8.round_to("float32")  # the router, its bias and the gate as stored
    w8 = dataclasses.replace(w8, router_weight=b16.router_weight, score_bias=f32.score_bias,
                             shared_gate=b16.shared_gate)
    got = MoEWeights.from_hf(fp8_state_dict(w8, cfg, layout, "model.layers.3.mlp."), cfg)
    assert got.is_fp8
    assert_same(got, w8)
    x = rng.standard_normal((5, cfg.hidden_size))
    np.testing.assert_array_equal(moe_forward(x, got, cfg), moe_forward(x, w8, cfg))


def test_fp8_checkpoint_quantized_by_torch():
    """A checkpoint written with torch's own ops (float32 amax / 448, float32 division, torch's e4m3 cast)
    reads back as the reference's quantization of the same float weights, bit for bit."""
    torch = pytest.importorskip("torch")

    cfg = FP8["deepseek_v3"]
    w = random_weights(cfg, seed=12).round_to("bfloat16")  # a bf16 model, as DeepSeek's are before the cast
    w8 = w.to_fp8()

    def torch_quantize(a):  # [R, C] -> (float8, float32 scales), torch ops only
        t = torch.from_numpy(a).float()
        R, C = t.shape
        pad = torch.zeros(-(-R // 128) * 128, -(-C // 128) * 128)
        pad[:R, :C] = t.abs()
        amax = pad.reshape(pad.shape[0] // 128, 128, pad.shape[1] // 128, 128).amax(dim=(1, 3))
        s = amax.clamp(min=1e-4) / 448.0
        full = s.repeat_interleave(128, 0).repeat_interleave(128, 1)[:R, :C]
        return (t / full).to(torch.float8_e4m3fn), s

    sd = fp8_state_dict(w8, cfg, "per_expert")
    I = cfg.intermediate_size
    for e in range(cfg.num_experts):
        for p, a in (("gate_proj", w.gate_up[e, :I]), ("up_proj", w.gate_up[e, I:]), ("down_proj", w.down[e])):
            sd[f"experts.{e}.{p}.weight"], sd[f"experts.{e}.{p}.weight_scale_inv"] = torch_quantize(a)
    got = weights_from_hf(sd, cfg)
    for name in ("gate_up", "down", "gate_up_scale_inv", "down_scale_inv"):
        np.testing.assert_array_equal(getattr(got, name), getattr(w8, name), err_msg=name)


def fp8_sd(family="deepseek_v3", layout="per_expert"):
    cfg = FP8[family]
    return cfg, fp8_state_dict(random_weights(cfg, seed=13, fp8=True), cfg, layout)


@pytest.mark.parametrize("layout, drop, match", [
    ("per_expert", "experts.2.down_proj.weight_scale_inv",
     r"missing key 'experts.2.down_proj.weight_scale_inv' \(expected shape \[2, 2\]\): the checkpoint is FP8"),
    ("per_expert", "shared_experts.up_proj.weight_scale_inv",
     r"missing key 'shared_experts.up_proj.weight_scale_inv' \(expected shape \[1, 2\]\)"),
    ("fused", "experts.gate_up_proj_scale_inv",
     r"missing key 'experts.gate_up_proj_scale_inv' \(expected shape \[4, 4, 2\]\).*'experts.down_proj_scale_inv'"),
])
def test_fp8_missing_scale_is_named(layout, drop, match):
    cfg, sd = fp8_sd(layout=layout)
    del sd[drop]
    with pytest.raises(InputError, match=match):
        weights_from_hf(sd, cfg)


def test_float8_weights_without_any_scale_are_refused():
    cfg, sd = fp8_sd()
    sd = {k: v for k, v in sd.items() if not k.endswith("scale_inv")}
    with pytest.raises(InputError, match=r"missing key 'experts.0.gate_proj.weight_scale_inv'.*is FP8 "
                                         r"\('experts.0.gate_proj.weight'\)"):
        weights_from_hf(sd, cfg)


def test_fp8_misshaped_scale_is_named():
    torch = pytest.importorskip("torch")
    cfg, sd = fp8_sd(layout="fused")
    sd["experts.down_proj_scale_inv"] = torch.ones(4, 1, 1)  # a per-tensor scale per expert: not DeepSeek's blocks
    with pytest.raises(InputError, match=r"state_dict\['experts.down_proj_scale_inv'\] must have shape \[4, 2, 2\], "
                                         r"got \[4, 1, 1\]"):
        weights_from_hf(sd, cfg)


def test_fp8_bad_values_and_scales_are_named():
    torch = pytest.importorskip("torch")
    cfg, sd = fp8_sd()
    bad = dict(sd, **{"experts.1.up_proj.weight": torch.full((256, 200), 0.3, dtype=torch.bfloat16)})
    with pytest.raises(InputError, match=r"state_dict\['experts.1.up_proj.weight'\] \(it has weight_scale_inv\) must "
                                         r"hold float8 e4m3 values"):
        weights_from_hf(bad, cfg)
    neg = dict(sd, **{"experts.0.down_proj.weight_scale_inv": -torch.ones(2, 2)})
    with pytest.raises(InputError, match=r"'experts.0.down_proj.weight_scale_inv'\] \(shape \[2, 2\]\) must be finite "
                                         r"and > 0, got -1.0"):
        weights_from_hf(neg, cfg)


def test_fp8_layouts_megamoe_cannot_hold_are_refused():
    torch = pytest.importorskip("torch")
    # I = 200: gate and up scale blocks would not tile the fused [2I, H]
    cfg = FP8["qwen2_moe"].replace(intermediate_size=200)
    sd = fp8_state_dict(random_weights(cfg.replace(intermediate_size=256), seed=0, fp8=True),
                        cfg.replace(intermediate_size=256), "per_expert")
    with pytest.raises(InputError, match=r"intermediate_size I=200, not a multiple of 128.*dequantize first"):
        weights_from_hf(sd, cfg)
    # gpt-oss's interleaved [E, H, 2I] with block scales
    g = TINY["gpt_oss"]
    gsd = hf_state_dict(random_weights(g, seed=0), g, "fused")
    gsd["experts.gate_up_proj_scale_inv"] = torch.ones(4, 1, 1)
    with pytest.raises(InputError, match=r"FP8 expert weights \('experts.gate_up_proj_scale_inv'\) are read only in"):
        weights_from_hf(gsd, g)
    # a scaled router: DeepSeek ships its gate unquantized
    cfg, sd = fp8_sd()
    with pytest.raises(InputError, match=r"quantized tensor 'gate.weight_scale_inv'"):
        weights_from_hf({**sd, "gate.weight_scale_inv": torch.ones(1, 2)}, cfg)
