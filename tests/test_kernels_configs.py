"""Tuned launch configs (megamoe.kernels.configs): the shipped JSON loads, bad files fail loudly."""

from __future__ import annotations

import json

import pytest

from megamoe.kernels import configs as cfgs
from megamoe.kernels import megakernel_config as mkc

GOOD = {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 128, "GROUP_M": 8, "num_warps": 4, "num_stages": 4}


def _write(tmp_path, entry, **top):
    d = {"gpu": "X", "dtype": "bfloat16", "triton": "0", "configs": {"E8_H64_I32_K2": {"1": entry}}}
    d.update(top)
    p = tmp_path / "c.json"
    p.write_text(json.dumps(d))
    return p


def test_shipped_files_load():
    files = sorted(cfgs.CONFIG_DIR.glob("*__*__triton-*.json"))  # the tuned files; the other two hold thresholds
    assert files, "no tuned configs shipped"
    for f in files:
        data = cfgs.load_file(f)
        assert data, f
    assert sorted(p.name for p in cfgs.CONFIG_DIR.glob("*.json")) == sorted([f.name for f in files] + ["megakernel.json", "thresholds.json"])


def test_thresholds_load_strictly(tmp_path):
    """configs/thresholds.json: every value with a unit and a source; a value a module reads that the file
    lacks, one the file has that nothing reads, and an entry without its source are errors, loudly."""
    from megamoe.kernels import thresholds as th

    d = th.load()
    assert set(d) == {"router", "align", "fp8"}
    assert all(e["source"].strip() and e["unit"] for sec in d.values() for e in sec.values())
    assert cfgs.ROUTER_PREFILL_T == d["router"]["ROUTER_PREFILL_T"]["value"]
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"router": {"A": {"value": 1, "unit": "u", "source": "s"},
                                        "B": {"value": [8, 4], "unit": "u", "source": "s"}}}))
    t = th.Thresholds("router", p)
    assert t["B"] == (8, 4)
    with pytest.raises(th.ThresholdError, match=r"section 'router' lacks 'C'"):
        t["C"]
    with pytest.raises(th.ThresholdError, match=r"values nothing reads: \['A'\]"):
        t.close()
    with pytest.raises(th.ThresholdError, match=r"no section 'fp8'"):
        th.Thresholds("fp8", p)
    p.write_text(json.dumps({"router": {"A": {"value": 1, "unit": "u"}}}))
    with pytest.raises(th.ThresholdError, match=r"router.A must have exactly the keys \['value', 'unit', 'source'\]"):
        th.Thresholds("router", p)
    p.write_text(json.dumps({"router": {"A": {"value": 1, "unit": "u", "source": " "}}}))
    with pytest.raises(th.ThresholdError, match=r"non-empty source"):
        th.Thresholds("router", p)


def test_unknown_key_fails_loudly(tmp_path):
    p = _write(tmp_path, {"gemm1": dict(GOOD, BLOCK_Q=3), "gemm2": GOOD})
    with pytest.raises(cfgs.KernelConfigError, match=r"unknown keys \['BLOCK_Q'\]"):
        cfgs.load_file(p)


def test_block_m_must_agree(tmp_path):
    p = _write(tmp_path, {"gemm1": GOOD, "gemm2": dict(GOOD, BLOCK_M=32)})
    with pytest.raises(cfgs.KernelConfigError, match="share BLOCK_M"):
        cfgs.load_file(p)


def test_bad_bucket_and_top_level(tmp_path):
    p = _write(tmp_path, {"gemm1": GOOD, "gemm2": GOOD}, extra=1)
    with pytest.raises(cfgs.KernelConfigError, match="top-level keys"):
        cfgs.load_file(p)


def test_split_k_is_optional_and_defaults_to_one():
    assert cfgs.check_gemm_config(GOOD, "x")["SPLIT_K"] == 1


@pytest.mark.parametrize("T,bucket", [(0, 1), (1, 1), (2, 1), (3, 8), (13, 8), (100, 64), (700, 512), (9000, 16384)])
def test_buckets(T, bucket):
    assert cfgs.bucket_of(T) == bucket


def test_max_padded_rows_bounds_any_routing():
    # 3 pairs on 3 experts, block 16: at most 3 blocks
    assert cfgs.max_padded_rows(3, 7, 16) == 48
    assert cfgs.max_padded_rows(0, 7, 16) == 0
    assert cfgs.max_padded_rows(100, 4, 16) == 16 * ((100 + 4 * 15 + 15) // 16)


def test_auto_backend_reads_the_measured_table(tmp_path, monkeypatch):
    """backend="auto" follows the tuned file's backend table (written from same-run H200 rows by
    benchmarks/pick_backend.py), nearest bucket where a T is not in it; elsewhere the multi-launch path."""
    from megamoe.kernels import configs as cfgs

    assert cfgs.select_backend(7, 40, 36, 3, 1, gpu="cpu-interpreter", dtype="float32", triton_version="x") == "multi"
    table = tmp_path / "table.json"
    table.write_text('{"gpu": "g", "dtype": "bfloat16", "triton": "t", "configs": {}, '
                     '"backend": {"E256_H7168_I2048_K8": {"1": "megakernel", "512": "multi"}}}')
    monkeypatch.setattr(cfgs, "config_path", lambda *a: table)
    cfgs._backends.cache_clear()
    kw = dict(gpu="g", dtype="bfloat16", triton_version="t")
    try:
        assert cfgs.select_backend(256, 7168, 2048, 8, 1, **kw) == "megakernel"
        assert cfgs.select_backend(256, 7168, 2048, 8, 4096, **kw) == "multi"     # nearest bucket 512
        assert cfgs.select_backend(128, 2048, 768, 8, 1, **kw) == "multi"         # shape not in the table
    finally:
        cfgs._backends.cache_clear()
    bad = tmp_path / "bad.json"
    bad.write_text('{"gpu": "g", "dtype": "bfloat16", "triton": "t", "configs": {}, "backend": {"E1_H1_I1_K1": {"1": "fast"}}}')
    monkeypatch.setattr(cfgs, "config_path", lambda *a: bad)
    cfgs._backends.cache_clear()
    try:
        with pytest.raises(cfgs.KernelConfigError, match="'megakernel' or 'multi'"):
            cfgs.select_backend(1, 1, 1, 1, 1, gpu="g", dtype="bfloat16", triton_version="t")
    finally:
        cfgs._backends.cache_clear()


def test_decode_stages_fit_the_stage_budget():
    """decode_stage_bytes: the largest GEMM task's A tile plus its weight tiles; decode_stages: as
    many as fit in STAGE_BYTES, between ``least`` and 6."""
    from megamoe.kernels.megakernel_config import STAGE_BYTES, decode_stage_bytes, decode_stages

    tiles = {"gemm1": {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 128}, "gemm2": {"BLOCK_N": 128, "BLOCK_K": 128},
             "shared": {"BLOCK_M": 16, "BLOCK_N1": 128, "BLOCK_K": 128}}
    assert decode_stage_bytes(tiles, False) == 16 * 128 * 2 + 2 * 128 * 64 * 2  # GEMM 1 and GEMM 2: 36 KiB each
    assert decode_stage_bytes(tiles, True) == 16 * 128 * 2 + 2 * 128 * 128 * 2  # the shared MLP's wider GEMM 1
    assert decode_stage_bytes(tiles, False, weight_bytes=1) == 16 * 128 * 2 + 2 * 128 * 64
    assert decode_stages(STAGE_BYTES // 4) == 5 and decode_stages(1024) == 6
    assert decode_stages(STAGE_BYTES) == 3 and decode_stages(STAGE_BYTES, least=2) == 2
    assert decode_stages(1024, most=10) == 10 and decode_stages(STAGE_BYTES // 8, most=10) == 9


def test_megakernel_reads_weights_through_tma_where_run_t_measured_it_faster():
    """Config "tma_weights" (configs.megakernel_tma_weights): on where the weight tiles are 16 KiB
    or more (Qwen3-30B-A3B at T = 1: 64 x 128; 128-row blocks at T = 4096, run V), and so at decode
    for gpt-oss-120b and Qwen3-235B-A22B, whose decode tiles are 64 columns or more (run U:
    32-column cp.async tiles slower than 64-column TMA tiles); off under the interpreter's tiny tiles."""
    from megamoe.kernels.megakernel_config import megakernel_config
    from megamoe.reference import MoEConfig

    def mk(name, T, **kw):
        c = MoEConfig.preset(name)
        return megakernel_config(c.num_experts, c.hidden_size, c.intermediate_size, c.top_k,
                                 c.shared_intermediate_size, T, num_sms=132, **kw)

    assert mk("qwen3-30b-a3b", 1)["tma_weights"] and mk("qwen3-30b-a3b", 512)["tma_weights"]
    for name in ("gpt-oss-120b", "qwen3-235b-a22b"):
        m = mk(name, 1)
        assert m["tma_weights"] and min(m["tiles"]["gemm1"]["BLOCK_N"], m["tiles"]["gemm2"]["BLOCK_N"]) >= 64
    assert mk("gpt-oss-120b", 8)["tma_weights"]
    assert mk("qwen3-30b-a3b", 4096)["tma_weights"]
    # the cost model's name for them (simulator.cost.MEGAKERNEL_LOADS)
    from megamoe.kernels.megakernel_config import megakernel_weight_loads
    from megamoe.simulator.cost import MEGAKERNEL_LOADS

    assert megakernel_weight_loads(mk("qwen3-30b-a3b", 1)) == "tma" and megakernel_weight_loads({}) == "pointer"
    assert megakernel_weight_loads(mk("qwen3-30b-a3b", 1, interpret=True)) == "pointer"
    assert {megakernel_weight_loads(m) for m in ({}, mk("qwen3-30b-a3b", 1))} == set(MEGAKERNEL_LOADS)
    assert not mk("qwen3-30b-a3b", 1, interpret=True).get("tma_weights")


def test_one_token_is_routed_by_every_gemm1_task_up_to_128_experts():
    """T = 1, bf16, the logits computed in the kernel: every GEMM 1 task routes the token itself
    (tiles["router"]["EACH"]) where E <= ROUTE_EACH_MAX_EXPERTS; not with 256 experts (DeepSeek-V3's
    grouped selection spills in every GEMM 1 task), FP8 or more than one token. A routing given at
    T = 1 takes EACH for any E (its GEMM 1 tasks only read the K picks); past one token, top-k tasks
    of given_topk_tokens tokens side by side and ALIGN_EACH (up to ALIGN_EACH_MAX_T)."""
    def each(E, T=1, **kw):
        mk = mkc.megakernel_config(E, 2048, 768, 8, 0, T, num_sms=132, **kw)
        return mk["tiles"]["router"].get("EACH", 0)

    assert mkc.ROUTE_EACH_MAX_EXPERTS == 128
    assert each(128) == 1 and each(8) == 1
    assert each(256) == 0
    assert each(128, T=2) == 0 and each(128, T=8) == 0
    assert each(128, fp8="weights") == 0
    assert each(128, routing_given=True) == 1 and each(256, routing_given=True) == 1
    assert each(256, T=8, routing_given=True) == 0
    for T, tt in ((2, 1), (16, 1), (17, 4), (mkc.ALIGN_EACH_MAX_T, 4)):
        r = mkc.megakernel_config(256, 2048, 768, 8, 0, T, num_sms=132, routing_given=True)["tiles"]["router"]
        assert (r["BLOCK_T"], r["TOPK_T"], r["SPLIT"], r.get("ALIGN_EACH")) == (tt, tt, 1, 1), (T, r)
    r = mkc.megakernel_config(256, 2048, 768, 8, 0, 65, num_sms=132, routing_given=True)["tiles"]["router"]
    assert r["TOPK_T"] == r["BLOCK_T"] and not r.get("ALIGN_EACH")
    mk = mkc.megakernel_config(128, 2048, 768, 8, 0, 1, num_sms=132)
    assert mkc.route_each(mk) == mk  # applying it twice changes nothing


def test_router_prefill_logits_launch():
    """The multi-launch router: at decode (fewer than ROUTER_PREFILL_BLOCKS routing blocks) and where the
    walk is short its logits launch is the decode split of before (the megakernel reads the same
    decode_router_split); otherwise 128-token x 64-column tiles with H split until tiles x ranges fill
    the SMs, never below ROUTER_PREFILL_MIN_STEPS steps a range, and whole BLOCK_H steps; split=0 walks H."""
    from megamoe.kernels import configs as cfgs
    from megamoe.kernels import megakernel_config as mkc
    from megamoe.kernels.plan import router_launch

    E, H, K = 256, 7168, 8  # DeepSeek-V3
    for T in (1, 16, 64, 480):
        assert not cfgs.router_prefill(T, E, H)
        rl = router_launch(T, E, H, K, 8)
        assert rl == router_launch(T, E, H, K, 8, split=cfgs.decode_router_split(T, E, H))
        assert rl["LOGITS_T"] == rl["BLOCK_T"] == cfgs.router_block_t(T, E)
        assert rl["BLOCK_H"] == cfgs.router_block_h(E, H)
    for T, sms in ((512, 132), (4096, 132), (4096, 78), (16384, 132), (100_000, 132)):
        assert cfgs.router_prefill(T, E, H) and cfgs.decode_router_split(T, E, H) == 0
        rl = router_launch(T, E, H, K, 8, num_sms=sms)
        tiles, S = rl["logits_grid"]
        assert rl["LOGITS_T"] == cfgs.ROUTER_PREFILL_T and rl["BLOCK_H"] == cfgs.ROUTER_PREFILL_H
        assert tiles == -(-T // cfgs.ROUTER_PREFILL_T) and S == rl["SPLIT"] >= 1
        assert rl["H_PER_SPLIT"] % rl["BLOCK_H"] == 0 and (S - 1) * rl["H_PER_SPLIT"] < H <= S * rl["H_PER_SPLIT"]
        assert rl["H_PER_SPLIT"] >= cfgs.ROUTER_PREFILL_MIN_STEPS * rl["BLOCK_H"]
        assert tiles * S <= max(sms, tiles)  # fills, never past, the SMs (more tiles than SMs: no split)
        assert rl["C"] == -(-T // cfgs.router_block_t(T, E))  # the routing and align blocks are unchanged
    # Qwen3-30B-A3B walks 2048 / 64 = 32 steps: no logits launch at prefill (the tiles are there on request)
    assert not cfgs.router_prefill(4096, 128, 2048) and router_launch(4096, 128, 2048, 8)["SPLIT"] == 0
    assert router_launch(4096, 128, 2048, 8, num_sms=132, tiles=True)["logits_grid"] == (32, 4)
    assert router_launch(4096, 128, 4096, 8, num_sms=132)["logits_grid"] == (32, 4)  # Qwen3-235B-A22B: 64 steps
    walk = router_launch(4096, E, H, K, 8, split=0)
    assert walk["SPLIT"] == 0 and walk["LOGITS_T"] == walk["BLOCK_T"] and walk["BLOCK_H"] == cfgs.router_block_h(E, H)
    mk = mkc.megakernel_config(E, H, 2048, K, 0, 4096, num_sms=132)
    assert mk["tiles"]["router"]["SPLIT"] <= 1  # the megakernel's prefill router walks H (decode_router_split)


def test_megakernel_router_splits_up_to_512_tokens():
    """The megakernel's logits over ranges of H up to MEGAKERNEL_SPLIT_MAX_T tokens (16 blocks of 32,
    where decode_router_split stops): ranges of at most MEGAKERNEL_SPLIT_STEPS BLOCK_H steps, at least 4
    of them, as run BH measured (4 ranges at Qwen3-30B-A3B, 7 at DeepSeek-V3's 224 steps), top-k tasks of 16
    tokens up to MEGAKERNEL_TOPK16_MAX_E experts at 16 blocks (run BK), of 4 past it and below 16 blocks; past
    512 tokens each block's top-k task walks H; the multi-launch router at 512 is unchanged."""
    from megamoe.kernels import configs as cfgs
    from megamoe.kernels import megakernel_config as mkc
    from megamoe.kernels.plan import router_launch

    def router(E, H, T):
        return mkc.megakernel_config(E, H, 2048, 8, 0, T, num_sms=132)["tiles"]["router"]

    assert cfgs.decode_router_split(512, 128, 2048) == 0  # the multi-launch path's rule: 16 blocks walk
    assert router(128, 2048, 512) == {"BLOCK_T": 32, "BLOCK_H": 64, "SPLIT": 4, "TOPK_T": 16}  # Qwen3-30B-A3B (run BK)
    assert router(256, 7168, 512)["SPLIT"] == 7 and router(256, 7168, 512)["TOPK_T"] == 4  # DeepSeek-V3: 224 steps
    assert router(8, 4096, 512)["SPLIT"] == 4 and router(8, 4096, 512)["TOPK_T"] == 16  # Mixtral-8x7B: 64 steps
    assert router(128, 2048, 480)["TOPK_T"] == 4  # 15 blocks: groups of 4 as before
    assert router(128, 2048, 513)["SPLIT"] <= 1 and router(128, 2048, 513)["TOPK_T"] == 32
    assert router(128, 2048, 256)["SPLIT"] == cfgs.decode_router_split(256, 128, 2048)  # below: as before
    assert router(128, 512, 512)["SPLIT"] <= 1  # a narrow H walks
    assert router_launch(512, 128, 2048, 8)["SPLIT"] == 0


def test_align_warps_follow_the_expert_block():
    """The align kernels run 4 warps up to ALIGN_WARPS4_MAX_E experts a block, 8 past it (Kimi K2)."""
    from megamoe.kernels.plan import ALIGN_WARPS4_MAX_E, align_launch

    assert align_launch(128, 8, 256, 32, 128, 510)["num_warps"] == 4 and ALIGN_WARPS4_MAX_E == 256
    assert align_launch(128, 8, 384, 32, 128, 510)["num_warps"] == 8


def test_auto_backend_reads_each_fp8_modes_own_table(tmp_path, monkeypatch):
    """FP8 weights: backend="auto" follows the file's backend_fp8 table of that mode (not the bf16 one)
    and the multi-launch path where that mode has no table; a mode the kernels do not know is named."""
    from megamoe.kernels import configs as cfgs

    table = tmp_path / "table.json"
    table.write_text('{"gpu": "g", "dtype": "bfloat16", "triton": "t", "configs": {}, '
                     '"backend": {"E256_H7168_I2048_K8": {"1": "multi"}}, '
                     '"backend_fp8": {"weights+act": {"E256_H7168_I2048_K8": {"1": "megakernel", "8": "multi"}}}}')
    monkeypatch.setattr(cfgs, "config_path", lambda *a: table)
    cfgs._backends.cache_clear()
    kw = dict(gpu="g", dtype="bfloat16", triton_version="t")
    try:
        assert cfgs.load_file(table) == {}                                   # the key is allowed in a tuned file
        assert cfgs.select_backend(256, 7168, 2048, 8, 1, **kw) == "multi"   # bf16: its own table
        assert cfgs.select_backend(256, 7168, 2048, 8, 1, fp8="weights+act", **kw) == "megakernel"
        assert cfgs.select_backend(256, 7168, 2048, 8, 9, fp8="weights+act", **kw) == "multi"
        assert cfgs.select_backend(256, 7168, 2048, 8, 1, fp8="weights", **kw) == "multi"  # no table for the mode
        with pytest.raises(cfgs.KernelConfigError, match="backend_fp8 modes must be of"):
            cfgs.select_backend(256, 7168, 2048, 8, 1, fp8="int4", **kw)
    finally:
        cfgs._backends.cache_clear()


def test_pick_backend_writes_only_the_tables_its_rows_fill(tmp_path, monkeypatch):
    """benchmarks/pick_backend.py: FP8 rows (bench_megakernel.py --fp8) fill backend_fp8[mode], bf16 rows
    "backend"; a table no row fills is kept as it was; the faster backend needs the margin."""
    import json

    from benchload import load_benchmark

    from megamoe.kernels import configs as cfgs

    pb = load_benchmark("pick_backend")
    tuned = tmp_path / "tuned.json"
    tuned.write_text(json.dumps({"gpu": "g", "dtype": "bfloat16", "triton": "t", "configs": {},
                                 "backend": {"E8_H4096_I14336_K2": {"1": "megakernel"}}}))
    monkeypatch.setattr(cfgs, "config_path", lambda *a: tuned)
    row = dict(gpu="g", triton="t", preset="deepseek-v3", routing="uniform")
    rows = tmp_path / "rows.jsonl"
    rows.write_text("\n".join(json.dumps(r) for r in [
        {**row, "T": 1, "fp8": "weights+act", "megakernel_us": 150.0, "multi_us": 170.0},
        {**row, "T": 8, "fp8": "weights+act", "megakernel_us": 700.0, "multi_us": 710.0,   # inside the 3% margin,
         "variants": [{"name": "newdef", "us": 600.0, "ok": True}]},                       # unless adopted
        {**row, "T": 8, "fp8": "weights+act", "routing": "concentrated", "megakernel_us": 1.0, "multi_us": 9.0},
    ]) + "\n")
    try:
        assert pb.main([str(rows)]) == 0
        d = json.loads(tuned.read_text())
        assert d["backend"] == {"E8_H4096_I14336_K2": {"1": "megakernel"}}      # bf16's table untouched
        assert d["backend_fp8"] == {"weights+act": {"E256_H7168_I2048_K8": {"1": "megakernel", "8": "multi"}}}
        assert pb.main([str(rows), "--adopt", "newdef@8"]) == 0      # the variant, now the default, is 600 us
        assert json.loads(tuned.read_text())["backend_fp8"]["weights+act"]["E256_H7168_I2048_K8"]["8"] == "megakernel"
        assert pb.main([str(rows), "--adopt", "newdef@x"]) == 2
        bad = tmp_path / "bad.jsonl"
        bad.write_text(json.dumps({**row, "T": 1, "fp8": "int4", "megakernel_us": 1.0, "multi_us": 2.0}) + "\n")
        assert pb.main([str(bad)]) == 2
    finally:
        cfgs._backends.cache_clear()
