"""The GEMM configs a multi-launch validation row ran: recovered for stored rows that record none
(``configs.config_without_model``), taken from the row where it records them, and priced by
``megamoe validate --repredict`` (megamoe/repredict.py). No GPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from megamoe.kernels import configs as cfgs

#: four multi-launch rows of the H100 validation run and its calibrated profile (tests/data/validation/README.md)
STORED = Path(__file__).resolve().parent / "data" / "validation" / "h100"


def _rows() -> list[dict]:
    rows = [json.loads(line) for line in (STORED / "validation.jsonl").read_text().splitlines() if line.strip()]
    assert len(rows) == 4 and all("gemm_config" not in r for r in rows)
    return rows


def _profile():
    from megamoe.simulator.hardware import load_profile

    return load_profile(str(STORED / "profile.json"))


def test_rows_without_an_entry_repredict_as_predicted_before_their_measurement():
    """The H100 rows record no GEMM entry; they ran the heuristic (no tuned file for that GPU, no model
    table then). Re-predicted with their run's profile they give the predictions written before each
    measurement, which priced the configs that ran (a change of a default-path term of the cost model
    moves them: re-pin from the stored report then)."""
    from megamoe.repredict import repredict_rows

    rows = _rows()
    out, skipped = repredict_rows(rows, _profile())
    assert skipped == 0
    assert [r["predicted_us"] for r in out] == pytest.approx([r["predicted_us"] for r in rows], rel=1e-9, abs=0.0)


def test_a_row_that_records_its_entries_is_priced_with_them():
    """A row's own ``gemm_config`` / ``shared_gemm_config`` (what measure.py writes) price it, not the
    entry its GPU would get: DeepSeek-V3 (one shared expert) at T = 512 with another candidate for each."""
    from megamoe.predict import predict_config
    from megamoe.reference import MoEConfig
    from megamoe.repredict import repredict_rows

    row = next(r for r in _rows() if r["preset"] == "deepseek-v3")
    cfg = MoEConfig.preset("deepseek-v3")
    E, H, I, K, T = cfg.num_experts, cfg.hidden_size, cfg.intermediate_size, cfg.top_k, row["T"]
    ran = cfgs.config_without_model(E, H, I, K, T, gpu=row["gpu"], dtype="bfloat16", triton_version=row["triton"])
    cands = cfgs.candidates(E, H, I, K, T)
    other = next({"gemm1": g1, "gemm2": g2} for g1 in cands["gemm1"] for g2 in cands["gemm2"]
                 if g1["BLOCK_M"] == g2["BLOCK_M"] and g1["BLOCK_M"] != ran["gemm1"]["BLOCK_M"])
    shared = cfgs.resolve_variants(cfgs.tma_entry(128), H, cfg.shared_intermediate_size, "bfloat16")
    recorded = {**row, "gemm_config": other, "shared_gemm_config": shared}
    (got,), _ = repredict_rows([recorded], _profile())
    want = predict_config(cfg, row["counts"], T, "multi", _profile(), device_name=row["gpu"],
                          calls_per_graph=row["calls_per_graph"], triton_version=row["triton"], reps=row["reps"],
                          gemm=other, shared_gemm=shared)
    assert got["predicted_us"] == want["predicted_us"]
    assert abs(got["predicted_us"] / row["predicted_us"] - 1) > 0.01  # another entry, another price


@pytest.fixture
def tables(tmp_path, monkeypatch):
    """A fake GPU with a tuned file (T = 1 bucket of one shape) and a model table (buckets 1 and 4096)."""
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "families.json").write_text(json.dumps({"devices": {"Fake GPU": "fake"}}))

    def mk(bm, bn):
        return {g: dict(cfgs.GEMM_OPTIONAL, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=64, GROUP_M=8, num_warps=4, num_stages=3)
                for g in ("gemm1", "gemm2")}

    (model_dir / "fake__bfloat16.json").write_text(json.dumps({
        "gpu": "fake", "dtype": "bfloat16", "triton": "any",
        "configs": {"E8_H64_I32_K2": {"1": mk(16, 32), "4096": mk(64, 32)}, "E16_H64_I32_K2": {"8": mk(32, 32)}}}))
    tuned = tmp_path / "tuned.json"
    tuned.write_text(json.dumps({"gpu": "Fake GPU", "dtype": "bfloat16", "triton": "t",
                                 "configs": {"E8_H64_I32_K2": {"1": mk(16, 128)}}}))
    monkeypatch.setattr(cfgs, "MODEL_DIR", model_dir)
    monkeypatch.setattr(cfgs, "config_path", lambda gpu, dtype, tv: tuned if (gpu, tv) == ("Fake GPU", "t")
                        else tmp_path / "absent.json")
    caches = (cfgs.families, cfgs._model, cfgs._tuned)
    for c in caches:
        c.cache_clear()
    yield dict(gpu="Fake GPU", dtype="bfloat16")
    for c in caches:
        c.cache_clear()


def test_config_without_model_is_the_tuned_entry_else_the_heuristic(tables):
    """Tuned at T's bucket, a tuned neighbour bucket (where select_config now takes the model's), the
    heuristic where only the model has a table, the interpreter's heuristic; another Triton version
    has no tuned file."""
    def bn(E, T, tv="t", **kw):
        return cfgs.config_without_model(E, 64, 32, 2, T, triton_version=tv, **tables, **kw)["gemm1"]["BLOCK_N"]

    heuristic = cfgs.resolve_variants(cfgs.default_config(16, 64, 32, 2, 8), 64, 32, "bfloat16")
    assert bn(8, 1) == 128 and bn(8, 4096) == 128
    assert cfgs.select_config(8, 64, 32, 2, 4096, triton_version="t", **tables)["gemm1"]["BLOCK_N"] == 32
    assert cfgs.config_without_model(16, 64, 32, 2, 8, triton_version="t", **tables) == heuristic
    assert cfgs.config_source(16, 64, 32, 2, 8, triton_version="t", **tables) == "model"
    assert bn(8, 1, tv="other") == heuristic["gemm1"]["BLOCK_N"]
    assert cfgs.config_without_model(8, 64, 32, 2, 1, triton_version="t", interpret=True, **tables) == \
        cfgs.resolve_variants(cfgs.default_config(8, 64, 32, 2, 1, interpret=True), 64, 32, "bfloat16")


def test_a_row_reprices_with_the_tuned_table_as_it_was_when_measured(tables, monkeypatch):
    """``megamoe tune`` dates each entry it writes; a row measured before that date runs what came
    before it (the heuristic here), one measured after runs the entry; an undated entry is older
    than every row. A date that is not ISO 8601 is refused when the file is read."""
    from megamoe.kernels import tune

    monkeypatch.setattr("megamoe.kernels.moe.clear_caches", lambda: None)
    path = cfgs.config_path("Fake GPU", "bfloat16", "t")
    entry = {g: dict(cfgs.GEMM_OPTIONAL, BLOCK_M=16, BLOCK_N=256, BLOCK_K=64, GROUP_M=8, num_warps=4, num_stages=3)
             for g in ("gemm1", "gemm2")}
    tune.record(path, "Fake GPU", "bfloat16", "t", "E16_H64_I32_K2", 8, entry, date="2026-12-07T15:00:00+00:00")

    def bn(E, T, made):
        return cfgs.config_without_model(E, 64, 32, 2, T, triton_version="t", made=made, **tables)["gemm1"]["BLOCK_N"]

    heuristic = cfgs.resolve_variants(cfgs.default_config(16, 64, 32, 2, 8), 64, 32, "bfloat16")["gemm1"]["BLOCK_N"]
    assert bn(16, 8, "2026-12-07T14:59:59+00:00") == heuristic != 256
    assert bn(16, 8, "2026-12-07T15:00:00+00:00") == 256
    assert bn(8, 1, "2020-01-01T00:00:00+00:00") == 128  # undated
    tune.record(path, "Fake GPU", "bfloat16", "t", "E16_H64_I32_K2", 8, None)
    assert "dates" in json.loads(path.read_text()) and "E16_H64_I32_K2" not in json.loads(path.read_text())["dates"]
    bad = json.loads(path.read_text())
    bad["dates"] = {"E8_H64_I32_K2": {"1": "yesterday"}}
    path.write_text(json.dumps(bad))
    with pytest.raises(cfgs.KernelConfigError, match="'yesterday' is not an ISO 8601 date"):
        cfgs.load_file(path)


def test_multi_configs_are_select_configs_with_their_source(tables):
    """What measure.py records for a multi row: select_config's entry and config_source's word; the
    shared experts' entry only for a layer that has them."""
    from megamoe.reference import MoEConfig
    from megamoe.repredict import multi_configs

    cfg = MoEConfig(name="tiny", num_experts=8, hidden_size=64, intermediate_size=32, top_k=2)
    got = multi_configs(cfg, 4096, gpu="Fake GPU", triton_version="t")
    assert got == {"gemm_config": cfgs.select_config(8, 64, 32, 2, 4096, triton_version="t", **tables),
                   "config_source": "model"}
    assert multi_configs(cfg, 1, gpu="Fake GPU", triton_version="t")["config_source"] == "tuned"
    shared = MoEConfig(name="tiny-shared", num_experts=8, hidden_size=64, intermediate_size=32, top_k=2,
                       num_shared_experts=1, shared_intermediate_size=48)
    got = multi_configs(shared, 8, gpu="Fake GPU", triton_version="t")
    assert got["shared_gemm_config"] == cfgs.select_config(1, 64, 48, 1, 8, triton_version="t", **tables)
