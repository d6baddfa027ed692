"""benchmarks/bench_megakernel.py, megakernel_variants.py and megakernel_table.py without a GPU: the
--fp8 option, its warm-up jobs, the variants' configs, the printed row and the table's targets."""

from __future__ import annotations

import pytest
from benchload import load_benchmark


def _load(name):
    return load_benchmark(name)


def test_fp8_option_and_its_warm_up_jobs():
    bm, mv = _load("bench_megakernel"), _load("megakernel_variants")
    a = bm.parse_args(["--out", "x", "--fp8", "weights", "--presets", "qwen3-30b-a3b", "--variants",
                       "--variant-tokens", "1,8"])
    assert a.fp8 == "weights" and a.variants
    with pytest.raises(SystemExit):
        bm.parse_args(["--out", "x", "--fp8", "act"])
    jobs = mv.warm_jobs(["qwen3-30b-a3b"], [1, 8], [1, 8], fp8="weights")
    assert jobs[:2] == [("qwen3-30b-a3b", 1, "backends", "weights"), ("qwen3-30b-a3b", 8, "backends", "weights")]
    assert [j[2] for j in jobs[2:]] == list(mv.FP8_VARIANTS) * 2 and {j[3] for j in jobs} == {"weights"}
    assert {j[2] for j in mv.warm_jobs(["qwen3-30b-a3b"], [1], [1], fp8="weights+act")[1:]} == set(mv.FP8A_VARIANTS)
    assert mv.warm_jobs(["qwen3-30b-a3b"], [1], [1])[1:] == [("qwen3-30b-a3b", 1, v, None) for v in mv.T1_VARIANTS]
    assert mv.weight_gib("gpt-oss-120b", "weights") > 1.5 * mv.weight_gib("gpt-oss-120b")  # bf16, e4m3, slices
    # a job (GiB, heavy) starts while a process is free, heavy ones 3 at once, all within the GiB
    assert mv.can_start((50.0, False), [], 14, 100.0) and mv.can_start((120.0, True), [], 14, 100.0)  # alone
    assert not mv.can_start((22.0, True), [(22.0, True)] * 3, 14, 100.0)
    assert mv.can_start((5.0, False), [(22.0, True)] * 3, 14, 100.0)
    assert not mv.can_start((11.0, False), [(10.0, False)] * 9, 14, 100.0)
    assert not mv.can_start((1.0, False), [(1.0, False)] * 14, 14, 100.0)


def test_variant_names_option_names_the_variants_timed():
    """--variant-names replaces the per-T defaults in the warm-up and the timing; an unknown name is
    refused before any GPU work."""
    bm, mv = _load("bench_megakernel"), _load("megakernel_variants")
    a = bm.parse_args(["--out", "x", "--variants", "--variant-tokens", "8,64", "--variant-names", "noaeach,ptrw"])
    assert a.variant_names == "noaeach,ptrw"
    with pytest.raises(SystemExit):
        bm.parse_args(["--out", "x", "--variant-names", "noaeach,nosuch"])
    jobs = mv.warm_jobs(["qwen3-30b-a3b"], [64], [8, 64], names=("noaeach", "ptrw"))
    assert [j[1:3] for j in jobs[1:]] == [(8, "noaeach"), (8, "ptrw"), (64, "noaeach"), (64, "ptrw")]


@pytest.mark.parametrize("fp8", ["weights", "weights+act"])
def test_fp8_variants_are_distinct_legal_configs(fp8):
    """Each FP8 variant of the H200 decode config (Qwen3-30B-A3B T = 1) is a config of its own that the
    FP8 megakernel takes (BLOCK_K 128), its weight loads the other way than the default's."""
    from megamoe.kernels import bench as kb
    from megamoe.kernels import megakernel_config as mkc
    from megamoe.kernels.megakernel import check_fp8_tiles

    mv = _load("megakernel_variants")
    c = kb.bench_config("qwen3-30b-a3b")
    base = mkc.megakernel_config(c.num_experts, c.hidden_size, c.intermediate_size, c.top_k,
                                 c.shared_intermediate_size, 1, num_sms=132, fp8=fp8)
    names = mv.variant_names(1, fp8)
    got = mv.variant_configs(base, names)
    assert [n for n, _ in got] == ["default", *names]
    for _n, mk in got:
        check_fp8_tiles(mk, fp8)
    assert all(mk["tma_weights"] != base["tma_weights"] for _n, mk in got[1:])


def test_fp8_convert_constexpr():
    """"bits" is inline PTX on a GPU (CVT 2), Triton integer ops under the interpreter (1), nothing
    with FP8 activations (e4m3 x e4m3 products)."""
    import torch

    from megamoe.kernels.megakernel import build_launch, constexpr_values, megakernel_config
    from megamoe.reference import MoEConfig, random_weights

    cfg = MoEConfig(hidden_size=200, intermediate_size=136, num_experts=5, top_k=2)
    wt = random_weights(cfg, seed=3, fp8=True).to_torch("cpu", torch.float32)
    x = torch.zeros((3, 200))
    for fp8, gpu, cvt in (("weights", True, 2), ("weights", False, 1), ("weights+act", True, 0)):
        mk = megakernel_config(cfg, 3, torch.float32, torch.device("cpu"), fp8=fp8)
        kw = build_launch(x, wt, cfg, mk, fp8=fp8, gpu=gpu)[2]
        assert constexpr_values(kw)["CVT"] == cvt, (fp8, gpu)


def test_fp8_row_prints_the_speedup():
    bm = _load("bench_megakernel")
    row = {"preset": "qwen3-30b-a3b", "T": 1, "routing": "uniform", "floor_us": 10.0, "fp8": "weights",
           "megakernel_us": 20.0, "multi_us": 30.0, "bf16_megakernel_us": 36.0, "bf16_over_fp8": 1.8,
           "megakernel_ok": True, "multi_ok": True, "bf16_megakernel_ok": True,
           "variants": [{"name": "tmaw", "us": 18.0, "ok": True}]}
    s = bm.fmt_row(row)
    assert "bf16-mk      36.0" in s and "bf16/fp8  1.80" in s and "best variant 18.0" in s and "torch" not in s


def test_megakernel_table_holds_each_row_to_its_targets(tmp_path):
    """benchmarks/megakernel_table.py: each row's targets (T = 1: 1.15 x floor + 3 us, and 1.5x the
    multi path on the two small presets; uniform T in {8, 64}: 1.08 x floor; concentrated T = 64:
    1.3 x floor; T <= 512: not slower than multi), the later file's row where two repeat, FP8 rows
    left out, a failed megakernel named."""
    mt = _load("megakernel_table")
    base = {"gpu": "G", "torch": "t", "triton": "3.6.0", "commit": "abcdef0", "date": "2026-12-02"}
    rows = [
        {**base, "preset": "qwen3-30b-a3b", "T": 1, "routing": "uniform", "floor_us": 10.0, "megakernel_us": 15.0,
         "multi_us": 23.0, "torch_us": 50.0},
        {**base, "preset": "qwen3-30b-a3b", "T": 64, "routing": "concentrated", "floor_us": 10.0,
         "megakernel_us": 13.5, "multi_us": 13.0},
        {**base, "preset": "mixtral-8x7b", "T": 8, "routing": "uniform", "floor_us": 100.0, "megakernel_us": 108.0,
         "multi_us": 120.0},
        {**base, "preset": "mixtral-8x7b", "T": 4096, "routing": "uniform", "floor_us": 100.0,
         "megakernel_us": 300.0, "multi_us": 200.0},
        {**base, "preset": "mixtral-8x7b", "T": 1, "routing": "uniform", "floor_us": 100.0, "fp8": "weights",
         "megakernel_us": 1.0, "multi_us": 1.0},
    ]
    t = {(r["preset"], r["T"], r["routing"]): dict(mt.targets(r)) for r in rows[:4]}
    assert t[("qwen3-30b-a3b", 1, "uniform")] == {"<= 1.15 x floor + 3 us": False, ">= 1.5x multi": True,
                                                  "not slower than multi": True}
    assert t[("qwen3-30b-a3b", 64, "concentrated")] == {"<= 1.3 x floor": False, "not slower than multi": False}
    assert t[("mixtral-8x7b", 8, "uniform")] == {"<= 1.08 x floor": True, "not slower than multi": True}
    assert t[("mixtral-8x7b", 4096, "uniform")] == {}
    old, new = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    old.write_text("\n".join(__import__("json").dumps(r) for r in rows) + "\n")
    failed = {**rows[2], "megakernel_us": None, "megakernel_error": "RuntimeError: boom"}
    new.write_text(__import__("json").dumps(failed) + "\n")
    loaded = mt.load_rows([str(old), str(new)])
    assert len(loaded) == 4 and not any(r.get("fp8") for r in loaded)
    text = mt.table(loaded)
    assert "megakernel failed: RuntimeError: boom" in text and "Targets met: 2 of 5" in text
    assert "commit abcdef0" in text
    assert "Not measured: mixtral-8x7b T = 1 uniform" in text and "qwen3-30b-a3b T = 64 concentrated" not in text


def test_every_t1_variant_gives_a_layout_the_kernel_takes():
    """At T = 1 the default routes the token in every GEMM 1 task (tiles["router"]["EACH"]); each
    variant's config must still be one task_layout accepts."""
    from megamoe.kernels import megakernel_config as cfgs
    from megamoe.reference import MoEConfig
    from megamoe.reference.tiles import task_layout

    mv = _load("megakernel_variants")
    cfg = MoEConfig.preset("qwen3-30b-a3b")
    base = cfgs.megakernel_config(cfg.num_experts, cfg.hidden_size, cfg.intermediate_size, cfg.top_k,
                                  cfg.shared_intermediate_size, 1, num_sms=132)
    assert base["tiles"]["router"].get("EACH") == 1
    for _name, mk in mv.variant_configs(base, list(mv.VARIANTS)):
        task_layout(cfg, 1, mk["tiles"])  # raises InputError for a layout the kernel refuses
    assert dict(mv.variant_configs(base, ["noreach"]))["noreach"]["tiles"]["router"].get("EACH") is None


def test_variant_configs_of_no_names_is_the_default_alone():
    """megakernel_trace.py without --variants asks for [] and must trace the default only; None still
    means every variant that differs from the default."""
    from megamoe.kernels import megakernel_config as cfgs

    mv = _load("megakernel_variants")
    base = cfgs.megakernel_config(128, 2048, 768, 8, 0, 64, num_sms=132)
    assert [n for n, _ in mv.variant_configs(base, [])] == ["default"]
    assert len(mv.variant_configs(base, None)) > 2


def test_megakernel_table_adopts_a_variant_that_became_the_default():
    """megakernel_table.py --adopt NAME[@T,...]: a row that timed the variant and passed its check
    shows the variant's time as the megakernel's (its targets judged on it, marked and named); a
    failed variant, another T, or a row without the variant keeps the run's default; a bad T is refused."""
    mt = _load("megakernel_table")
    base = {"gpu": "G", "torch": "t", "triton": "3.6.0", "commit": "abcdef0", "date": "2026-12-03",
            "routing": "uniform", "floor_us": 100.0, "multi_us": 110.0}
    rows = [{**base, "preset": "mixtral-8x7b", "T": 8, "megakernel_us": 120.0,
             "variants": [{"name": "deep", "us": 105.0, "ok": True}]},
            {**base, "preset": "mixtral-8x7b", "T": 64, "megakernel_us": 120.0,
             "variants": [{"name": "deep", "us": 105.0, "ok": True}]},
            {**base, "preset": "qwen3-30b-a3b", "T": 8, "megakernel_us": 120.0,
             "variants": [{"name": "deep", "us": 90.0, "ok": False}]}]
    adopted = mt.parse_adopt(["deep@8"])
    out = [mt.adopt(r, adopted) for r in rows]
    assert [r["megakernel_us"] for r in out] == [105.0, 120.0, 120.0]
    assert dict(mt.targets(out[0]))["<= 1.08 x floor"] and not dict(mt.targets(rows[0]))["<= 1.08 x floor"]
    text = mt.table(out)
    assert "105.0 †" in text and "mixtral-8x7b T = 8 uniform: deep" in text and "T = 64 uniform: deep" not in text
    assert mt.parse_adopt(["deep"]) == {"deep": None}
    with pytest.raises(ValueError, match="deep@x"):
        mt.parse_adopt(["deep@x"])
