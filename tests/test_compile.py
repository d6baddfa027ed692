"""``megamoe compile`` without a GPU: its input errors, its plan of jobs, and its driver end to end with
the job process replaced by a fake (megamoe.warm's scheduler, a worker that reports what its item says),
plus the Triton compile hooks the real worker records with."""

from __future__ import annotations

import argparse
import json
import sys
import textwrap

import pytest

from megamoe import compile as mc
from megamoe.cli import main
from megamoe.reference import MoEConfig

# A job process: every item ends ok and lists one kernel, except the dtype "fp8-act" (an error) and
# T = 13 (a crash); it records the TRITON_CACHE_DIR it was given.
FAKE_WORKER = textwrap.dedent("""
    import json, os, sys
    job = json.load(open(sys.argv[1]))
    assert job["task"] == "compile" and json.loads(job["model"])["hidden_size"] > 0
    st = open(job["status"], "a")
    def emit(**e):
        st.write(json.dumps(e) + "\\n"); st.flush()
    for dtype, backend, T in job["pairs"]:
        key = f"{job['preset']}/T={T}/{dtype}/{backend}"
        emit(key=key, event="start")
        if T == 13:
            os._exit(7)
        if dtype == "fp8-act":
            emit(key=key, event="error", error="KernelInputError: no")
        else:
            emit(key=key, event="ok", s=0.5, compiles=[["_k_" + backend, 0.25]],
                 cache=os.environ.get("TRITON_CACHE_DIR"))
    with open(os.path.join(os.path.dirname(job["status"]), "cache_seen.txt"), "a") as fh:
        fh.write(str(os.environ.get("TRITON_CACHE_DIR")) + "\\n")
""")


def _args(**kw) -> argparse.Namespace:
    base = dict(models="qwen3-30b-a3b", tokens="1,8", dtype="bf16", backends="multi,megakernel", procs=2,
                budget=120.0, item_timeout=30.0, cache_dir=None, work_dir=None, seed=0)
    return argparse.Namespace(**{**base, **kw})


@pytest.fixture
def fake_worker(tmp_path):
    path = tmp_path / "worker.py"
    path.write_text(FAKE_WORKER)
    return lambda job_path: [sys.executable, str(path), str(job_path)]


# --------------------------------------------------------------------------- input errors
@pytest.mark.parametrize("argv, says", [
    (["--models", "not-a-model"], "'not-a-model' is neither a preset"),
    (["--models", "qwen3-30b-a3b", "--tokens", "0,8"], "each T must be in [1,"),
    (["--models", "qwen3-30b-a3b", "--tokens", "8,x"], "comma-separated whole numbers or ranges A-B"),
    (["--models", "qwen3-30b-a3b", "--tokens", "9-3"], "'9-3': each T must be in [1, 1,048,576], a range's start"),
    (["--models", "qwen3-30b-a3b", "--tokens", "1-5000"], "more than 2048 token counts"),
    (["--models", "qwen3-30b-a3b", "--dtype", "fp16"], "subset of bf16,fp8,fp8-act; unknown: fp16"),
    (["--models", "qwen3-30b-a3b", "--backends", "auto"], "subset of multi,megakernel"),
    (["--models", "qwen3-30b-a3b", "--procs", "0"], "--procs 0: must be > 0"),
])
def test_bad_input_is_named_before_any_gpu_is_looked_for(argv, says, capsys):
    assert main(["compile", *argv]) == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err


def test_without_a_gpu_it_says_so(capsys):
    assert mc.run(_args(), free_bytes=lambda: None) == 2
    assert "megamoe compile needs a CUDA GPU; found none" in capsys.readouterr().err


def test_a_config_file_is_a_model(tmp_path):
    cfg = MoEConfig.preset("mixtral-8x7b").replace(name="my layer/v2")
    path = tmp_path / "layer.json"
    path.write_text(json.dumps(cfg.to_dict()))
    (name, got), (name2, _) = mc.parse_models(f"{path},mixtral-8x7b,{path}")  # the same layer twice: once
    assert got == cfg and name == "my layer/v2" and name2 == "mixtral-8x7b"
    other = tmp_path / "other.json"
    other.write_text(json.dumps(cfg.replace(top_k=1).to_dict()))
    assert [n for n, _ in mc.parse_models(f"{path},{other}")] == ["my layer/v2", "my layer/v2+"]
    job = mc.plan_jobs([(name, got)], [8], ["bf16"], ["multi"], lambda c, T, d: 1.0)[0]
    assert "/" not in job.name and " " not in job.name  # a file name for its job and log


# --------------------------------------------------------------------------- the plan
def test_jobs_are_one_per_model_and_t_largest_memory_first():
    models = mc.parse_models("qwen3-30b-a3b,deepseek-v3")
    jobs = mc.plan_jobs(models, mc.parse_tokens(None), ["bf16", "fp8"], ["multi", "megakernel"],
                        lambda cfg, T, dts: cfg.num_experts * 1e9 + T)
    assert len(jobs) == 2 * 6  # the tuned buckets by default
    assert [(j.preset, j.T) for j in jobs[:2]] == [("deepseek-v3", 16384), ("deepseek-v3", 4096)]
    assert jobs[0].pairs == tuple((d, b, 16384) for d in ("bf16", "fp8") for b in ("multi", "megakernel"))
    assert MoEConfig.from_dict(json.loads(jobs[0].model)) == MoEConfig.preset("deepseek-v3")
    assert jobs[0].keys()[2] == "deepseek-v3/T=16384/fp8/multi"


def test_an_fp8_dtype_adds_the_weights_fp8_copy_to_a_jobs_memory():
    cfg = MoEConfig.preset("deepseek-v3")
    bf16 = mc.job_bytes(lambda c, T: 30e9, cfg, 1, ["bf16"])
    both = mc.job_bytes(lambda c, T: 30e9, cfg, 1, ["bf16", "fp8"])
    assert bf16 == 30e9 and 10e9 < both - bf16 < 12e9  # 256 e4m3 experts of 3 x 7168 x 2048, scales included


def test_the_t_of_one_bucket_go_to_one_process():
    """T = 1..30: buckets 1 (T <= 2), 8 (3..22) and 64 (23..30); within a job, T ascending."""
    tokens = mc.parse_tokens("1-30")
    jobs = mc.plan_jobs(mc.parse_models("mixtral-8x7b"), tokens, ["bf16"], ["megakernel"], lambda c, T, d: T)
    assert [(j.T, [T for *_, T in j.pairs]) for j in jobs] == [(30, list(range(23, 31))), (22, list(range(3, 23))),
                                                              (2, [1, 2])]
    assert jobs[1].keys()[0] == "mixtral-8x7b/T=3/bf16/megakernel"


def test_tokens_are_deduplicated_and_sorted():
    assert mc.parse_tokens("64, 1,64,3-5") == [1, 3, 4, 5, 64]


# --------------------------------------------------------------------------- the driver, fake worker
def test_every_item_ends_ok_and_the_command_exits_0(tmp_path, fake_worker, capsys):
    work = tmp_path / "work"
    rc = mc.run(_args(work_dir=str(work), cache_dir=str(tmp_path / "cache")), free_bytes=lambda: 80e9,
                argv=fake_worker)
    out = capsys.readouterr().out
    assert rc == 0
    assert "qwen3-30b-a3b/T=8/bf16/megakernel" in out and "4/4 ok in" in out and "1 kernels" in out
    assert "ok: qwen3-30b-a3b/T=1/bf16/multi in 0.5 s, 1 kernels compiled or loaded" in out  # a progress line
    assert set((work / "cache_seen.txt").read_text().split()) == {str((tmp_path / "cache").resolve())}
    details = json.loads((work / "warm_status.json").read_text())["details"]
    assert details["qwen3-30b-a3b/T=1/bf16/multi"] == {"s": 0.5, "compiles": [["_k_multi", 0.25]]}


def test_an_error_or_a_crash_makes_the_command_exit_1(tmp_path, fake_worker, capsys):
    rc = mc.run(_args(tokens="8,13", dtype="bf16,fp8-act", backends="multi", work_dir=str(tmp_path / "w")),
                free_bytes=lambda: 80e9, argv=fake_worker)
    captured = capsys.readouterr()
    assert rc == 1
    st = json.loads((tmp_path / "w" / "warm_status.json").read_text())["status"]
    assert st["qwen3-30b-a3b/T=8/bf16/multi"] == "ok"
    assert st["qwen3-30b-a3b/T=8/fp8-act/multi"] == "error: KernelInputError: no"
    assert st["qwen3-30b-a3b/T=13/bf16/multi"] == "crashed (exit 7)"
    assert "3 not ok" in captured.err and "1/4 ok" in captured.out


def test_the_budget_ends_the_run(tmp_path, capsys):
    slow = tmp_path / "slow.py"
    slow.write_text("import time; time.sleep(60)\n")
    rc = mc.run(_args(tokens="1", backends="multi", budget=1.0, work_dir=str(tmp_path / "w")),
                free_bytes=lambda: 80e9, argv=lambda p: [sys.executable, str(slow)])
    assert rc == 1 and "0/1 ok" in capsys.readouterr().out


# --------------------------------------------------------------------------- the worker's compile record
def test_the_compile_record_hooks_into_triton_and_gives_them_back():
    knobs = pytest.importorskip("triton.knobs")
    from megamoe.warm import triton_compiles

    rt = knobs.runtime
    before = rt.jit_cache_hook, rt.jit_post_compile_hook

    class Fn:
        name = "_router_kernel"

    with triton_compiles() as got:
        # what JITFunction._do_compile calls around a compile (keyword arguments; False: go on)
        assert rt.jit_cache_hook(key="k", repr="r", fn=Fn(), compile={}, is_manual_warmup=False,
                                 already_compiled=False) is False
        assert rt.jit_post_compile_hook(key="k", repr="r", fn=Fn(), compile={}, is_manual_warmup=False,
                                        already_compiled=False) is False
    assert [k[0] for k in got] == ["_router_kernel"] and got[0][1] >= 0 and got[0][2] is None, "no specialization given"
    specs = {}
    with triton_compiles(specs) as got:
        for data in ('{"signature": "a"}', '{"signature": "b"}'):
            rt.jit_cache_hook(key="k", repr="r", fn=Fn(), compile={"specialization_data": data},
                              is_manual_warmup=False, already_compiled=False)
            rt.jit_post_compile_hook(key="k", repr="r", fn=Fn(), compile={"specialization_data": data},
                                     is_manual_warmup=False, already_compiled=False)
    assert len({k[2] for k in got}) == 2 and all(len(k[2]) == 16 for k in got), "two specializations, two digests"
    assert sorted(specs.values()) == ['{"signature": "a"}', '{"signature": "b"}']
    assert (rt.jit_cache_hook, rt.jit_post_compile_hook) == before


# --------------------------------------------------------------------------- the real worker, interpreted
@pytest.mark.interpret
@pytest.mark.slow
def test_the_real_worker_runs_each_item_under_the_interpreter(tmp_path):
    """The job process as ``megamoe compile`` starts it (python -m megamoe.warm), on a shrunken layer on
    the CPU: T = 3 and 5 (one bucket: one process) by both backends run and end ok, with an empty compile
    record (the interpreter compiles nothing)."""
    pytest.importorskip("triton")
    from megamoe.grid import shrink_for_interpreter

    cfg = shrink_for_interpreter(MoEConfig.preset("deepseek-v3"))  # grouped router, a shared expert
    jobs = mc.plan_jobs([("small", cfg)], [3, 5], ["bf16"], ["multi", "megakernel"], lambda c, T, d: 1.0)
    r = mc.compile_ahead(jobs, budget_s=300, item_timeout_s=240, procs=1, memory_bytes=64e9, folder=tmp_path,
                         layer_kind="interpreter", log=lambda s: None)
    assert r["status"] == {f"small/T={T}/bf16/{b}": "ok" for T in (3, 5) for b in ("multi", "megakernel")}, \
        (tmp_path / "small_T5.log").read_text()[-2000:]
    assert r["failed"] == [] and all(d["compiles"] == [] for d in r["details"].values())


def test_key_parts_read_what_tritons_cache_key_holds_besides_the_specialization():
    """From a post-compile hook's arguments: the compiled kernel's cache hash, the kernel's source key and
    the constexprs as the key prints them; a Triton whose objects lack them leaves those parts out."""
    from types import SimpleNamespace

    from megamoe.warm import _key_parts

    kernel = SimpleNamespace(hash="f" * 64)
    jf = SimpleNamespace(device_caches={0: ({"key1": kernel}, None)}, cache_key="src")
    kw = {"fn": SimpleNamespace(jit_function=jf), "key": "key1", "compile": {"device": 0, "constants": {(2,): 16, (1,): 4}}}
    parts = _key_parts(kw)
    assert parts["hash"] == "f" * 16 and len(parts["source"]) == len(parts["constants"]) == 16
    swapped = {**kw, "compile": {"device": 0, "constants": {(1,): 4, (2,): 16}}}
    assert _key_parts(swapped)["constants"] == parts["constants"], "in the key's order, not the dict's"
    assert not {"hash", "source", "constants"} & set(_key_parts({"fn": None, "compile": {}}))
