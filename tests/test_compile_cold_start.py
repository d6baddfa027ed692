"""benchmarks/cold_start.py on the CPU: its input errors, the budget that skips steps, and the --smoke
run (fresh processes under TRITON_INTERPRET=1, empty and compiled caches, megamoe compile's driver)."""

from __future__ import annotations

import json

import pytest
from benchload import load_benchmark

cs = load_benchmark("cold_start")


def _rows(folder):
    return [json.loads(line) for line in (folder / "cold_start.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("argv, says", [
    (["--presets", "qwen3-30b-a3b,nope", "--smoke"], "unknown ['nope']"),
    (["--budget-s", "0", "--smoke"], "--budget-s 0.0: must be > 0"),
])
def test_bad_input_is_refused(argv, says, capsys):
    assert cs.main(argv) == 2
    assert says in capsys.readouterr().err


def test_every_step_past_the_budget_is_skipped_and_named(tmp_path, capsys):
    assert cs.main(["--smoke", "--presets", "qwen3-30b-a3b", "--budget-s", "1e-9", "--out", str(tmp_path)]) == 1
    rows = _rows(tmp_path)
    assert [r["what"] for r in rows] == ["first_call"] * 3 + ["compile"]
    assert all(r["error"] == "skipped: past --budget-s" for r in rows)
    assert all(r["gpu"] == "cpu-interpreter" and r["commit"] for r in rows)  # provenance on every row


@pytest.mark.interpret
@pytest.mark.slow
def test_smoke_run_measures_both_caches_and_the_compile(tmp_path, capsys):
    assert cs.main(["--smoke", "--presets", "qwen3-30b-a3b", "--budget-s", "600", "--out", str(tmp_path)]) == 0
    rows = _rows(tmp_path)
    firsts = [r for r in rows if r["what"] == "first_call"]
    assert [(r["cache"], r["backend"], r["T"]) for r in firsts] == [
        (c, b, T) for c in ("empty", "compiled") for b, T in cs.SMOKE_ITEMS] + [
        ("compiled", b, T) for b, T in cs.OFF_BUCKET_ITEMS]
    assert all(r["output_ok"] and r["first_call_s"] > 0 and r["compiles"] == [] for r in firsts)
    (comp,) = [r for r in rows if r["what"] == "compile"]
    assert comp["rc"] == 0 and comp["items_ok"] == comp["items"] == 4  # T in {1, 5} x both backends
    out = capsys.readouterr().out
    assert "| qwen3-30b-a3b | megakernel | 1 |" in out and "`megamoe compile` (qwen3-30b-a3b)" in out
    table = (tmp_path / "cold_start.md").read_text()
    assert "| qwen3-30b-a3b | multi | 5 |" in table and "| qwen3-30b-a3b | megakernel | 2 | - | - |" in table
    status = json.loads((tmp_path / "compile_status.json").read_text())
    assert status["counts"] == {"ok": 4} and not (tmp_path / "compile_logs.tgz").exists()


def test_a_failed_compile_keeps_its_logs_beside_the_rows(tmp_path):
    import tarfile

    work, out = tmp_path / "work", tmp_path / "out"
    work.mkdir()
    out.mkdir()
    (work / "warm_status.json").write_text('{"counts": {"crashed": 1}}')
    (work / "deepseek-v3_T1.log").write_text("Traceback: out of resources")
    cs.keep_compile_files(work, out, failed=True)
    assert json.loads((out / "compile_status.json").read_text())["counts"] == {"crashed": 1}
    with tarfile.open(out / "compile_logs.tgz") as tar:
        assert "compile_work/deepseek-v3_T1.log" in tar.getnames()


_CENSUS = """
import json, sys
sys.path.insert(0, sys.argv[1])
import cold_start as cs
from megamoe.kernels import align, routing
from megamoe.reference import MoEConfig

# the JIT's key: T (do_not_specialize) stays an i32 whatever its value; E == 1 becomes a constexpr,
# E = 32 an i32 divisible by 16
args = (None,) * 6
for T, E in ((1, 1), (37, 32)):
    k = cs.jit_key(align._scatter_pairs_kernel, (*args, T, E), {"K": 2, "BLOCK_T": 16, "BLOCK_P": 32, "BLOCK_J": 32})
    print(json.dumps({n: [t, a] for n, t, a in k[1] if n in ("T", "E")}))
rows = cs.census(["qwen3-30b-a3b"], gpu="NVIDIA H100 80GB HBM3", triton_version="3.6.0", sms=132,
                 tokens=(1, 2, 3, 5, 17, 64, 100))
print(json.dumps(rows))
"""


def test_census_reads_the_launches_without_a_gpu():
    """The census in a process without TRITON_INTERPRET (it reads the JIT's signatures): Triton's own
    specialization of an argument, and per bucket the kernels of a call and their distinct variants."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", _CENSUS, str(cs.Path(cs.__file__).parent)], capture_output=True,
                       text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    one, other, rows = (json.loads(line) for line in r.stdout.splitlines()[-3:])
    assert one == {"T": ["i32", "None"], "E": ["constexpr", "1"]}
    assert other == {"T": ["i32", "None"], "E": ["i32", "'D'"]}
    by = {(x["backend"], x["bucket"]): x for x in rows}
    assert len(rows) == 12 and by["megakernel", 1]["kernels"] == ["_megakernel"]
    multi1 = by["multi", 1]["kernels"]
    assert {"_router_kernel", "_gemm1_kernel", "_gemm2_kernel", "_combine_kernel"} <= set(multi1)


def test_a_compiled_cache_miss_names_what_its_specialization_has_that_the_compiles_do_not(tmp_path):
    """A kernel a compiled-cache call compiled again: its specialization against the compile's of that
    kernel (from the compile's statuses), field by field, arguments named; one the compile never made;
    and a cache that grew although every specialization was the compile's."""
    def spec(x_attr, warps=4):
        return json.dumps({"name": "k", "signature": {"x_ptr": "*bf16", "n": "i32"}, "constant_keys": [[1]],
                           "constant_vals": [4], "attrs_keys": [[0], [1]], "attrs_vals": [x_attr, []],
                           "options": {"num_warps": warps}})

    status = tmp_path / "compile_status.json"
    status.write_text(json.dumps({"details": {
        "qwen3-30b-a3b/T=1/bf16/megakernel": {"s": 8.0, "compiles": [["_megakernel", 7.8, "d1"]],
                                              "specs": {"d1": spec([["tt.divisibility", 16]])}},
        "qwen3-30b-a3b/T=1/bf16/multi": {"s": 1.0, "compiles": [["_gemm1_kernel", 0.4]]},  # an older record
    }}))
    ahead = cs.compile_specs(status)
    assert ahead == {"qwen3-30b-a3b": {"_megakernel": [spec([["tt.divisibility", 16]])]}}
    row = {"new_cache_files": 8, "compiles": [["_megakernel", 7.9, "d2"], ["_router_kernel", 0.3, "d3"]],
           "specs": {"d2": spec([], warps=8), "d3": spec([])}}
    got = cs.not_compiled_ahead(row, ahead["qwen3-30b-a3b"])
    assert got == {"_megakernel": {"attrs_vals[x_ptr]": [[], [["tt.divisibility", 16]]], "options.num_warps": [8, 4]},
                   "_router_kernel": "not compiled by the compile"}
    same = {"new_cache_files": 2, "compiles": [["_megakernel", 0.1, "d1"]], "specs": {"d1": spec([["tt.divisibility", 16]])}}
    assert "cache key differs elsewhere" in cs.not_compiled_ahead(same, ahead["qwen3-30b-a3b"])["*"]


def test_a_miss_with_the_compiles_specialization_names_the_parts_of_the_key_that_differ(tmp_path):
    """The same specialization compiled again: the key parts each side recorded (megamoe.warm._key_parts)
    say which differs (here the kernel's source hash), or that only the rest of Triton's key can."""
    sp = json.dumps({"name": "k", "signature": {"x_ptr": "*bf16"}, "options": {"num_warps": 4}})
    parts = {"hash": "aaaa", "source": "s1", "constants": "c1", "env": {"TRITON_X": "0"}}
    status = tmp_path / "compile_status.json"
    status.write_text(json.dumps({"details": {"p/T=1/bf16/megakernel": {
        "s": 8.0, "compiles": [["_megakernel", 7.8, "d1", parts]], "specs": {"d1": sp}}}}))
    ahead, keys = cs.compile_specs(status)["p"], cs.compile_key_parts(status)
    assert keys == {"d1": [parts]}
    row = {"new_cache_files": 8, "specs": {"d1": sp},
           "compiles": [["_megakernel", 7.9, "d1", {**parts, "hash": "bbbb", "source": "s2"}]]}
    assert cs.not_compiled_ahead(row, ahead, keys) == {"_megakernel": {"hash": ["bbbb", "aaaa"], "source": ["s2", "s1"]}}
    row["compiles"][0][3]["source"] = "s1"
    got = cs.not_compiled_ahead(row, ahead, keys)["_megakernel"]
    assert got["hash"] == ["bbbb", "aaaa"] and "rest of Triton's key" in got["why"]
    hit = {"new_cache_files": 0, "specs": {"d1": sp}, "compiles": [["_megakernel", 0.1, "d1", parts]]}
    assert cs.not_compiled_ahead(hit, ahead, keys) == {}
