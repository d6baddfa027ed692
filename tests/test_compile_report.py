"""benchmarks/compile_report.py without compiling: config changes, the per-section PTX counts and the
SASS loop summary it prints with --loops."""

from __future__ import annotations

import inspect

import pytest


@pytest.fixture(scope="module")
def cr():
    """The module, loaded without letting it clear TRITON_INTERPRET for the rest of the session."""
    from benchload import load_benchmark

    return load_benchmark("compile_report")


def test_sets_parse_and_apply(cr):
    sets = cr.parse_sets(["topk_bitonic=1", "tiles.router.TOPK_T=4", "name=abc"])
    assert sets == {"topk_bitonic": 1, "tiles.router.TOPK_T": 4, "name": "abc"}
    mk = {"num_warps": 4, "tiles": {"router": {"TOPK_T": 1}}}
    out = cr.apply_sets(mk, sets)
    assert out["tiles"]["router"]["TOPK_T"] == 4 and out["topk_bitonic"] == 1
    assert mk["tiles"]["router"]["TOPK_T"] == 1, "the given config is left as it was"
    with pytest.raises(SystemExit, match="BLOCK_Q"):  # a typo in a tile key is refused
        cr.apply_sets(mk, {"tiles.router.BLOCK_Q": 2})
    with pytest.raises(SystemExit, match="KEY=VALUE"):
        cr.parse_sets(["topk_bitonic"])


def test_section_counts_follow_inlined_code(cr):
    """An instruction counts in a section when its line, or the line it was inlined at (3.9's .loc),
    or any line of 3.6's comment chain lies in a section function; Triton's library code (here a
    shuffle of tl.topk) belongs to the next instruction of ours; code elsewhere is not counted."""
    from megamoe.kernels import routing

    routing_py = inspect.getsourcefile(routing._topk_bitonic.fn)
    first = inspect.getsourcelines(routing._topk_bitonic.fn)[1]
    outside = inspect.getsourcelines(routing._route_block.fn)[1]
    ptx = "\n".join([
        f'\t.file\t1 "{routing_py}"',
        '\t.file\t2 "/x/triton/language/standard.py"',
        "\t.loc\t2 400 10, function_name $L__info_string0, inlined_at 2 500 3",
        "\tshfl.sync.bfly.b32 \t%r1, %r2, 1, 31, -1;",  # library only: the next instruction decides
        f"\t.loc\t1 {first + 6} 4",
        "\tbar.sync \t0;",
        f"\t.loc\t2 300 1, function_name $L__info_string0, inlined_at 1 {first + 7} 9",
        "\tst.shared.b64 \t[%r3], %rd1;",
        f"\t.loc\t2 300 1 // standard.py:300:1 @[ routing.py:{first + 8}:2 @[ megakernel.py:190:3 ] ]",
        "\tld.shared.b64 \t%rd2, [%r3];",
        f"\t.loc\t1 {outside + 1} 4",
        "\tbar.sync \t0;",  # _route_block's own code: not the top-k
    ])
    counts = cr.section_counts(ptx, {"topk": ("routing._topk_bitonic",)})
    assert counts["topk.instr"] == 4
    assert (counts["topk.bar"], counts["topk.shfl"], counts["topk.st.shared"], counts["topk.ld.shared"]) == (1, 1, 1, 1)
    assert cr.section_counts(ptx, {"align": ("align._scan",)}) == {}


SASS = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
.L_x_1:
	//## File "/w/kernels/fp8_gemm.py", line 190
        /*0010*/                   LDGSTS.E.BYPASS.128 [R2], desc[UR4][R4.64] ;
        /*0020*/                   DEPBAR.LE SB0, 0x4 ;
        /*0030*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
.L_x_2:
	//## File "/w/kernels/fp8_gemm.py", line 199
        /*0040*/                   F2FP.F16.E4M3.UNPACK_B R6, R7 ;
        /*0050*/                   F2F.BF16.F16 R8, R6 ;
        /*0060*/                   HMMA.16816.F32.BF16 R10, R12, R8, R10 ;
        /*0070*/               @P0 BRA `(.L_x_2) ;
        /*0080*/                   LDG.E R9, desc[UR4][R4.64] ;
        /*0090*/               @P1 BRA `(.L_x_1) ;
"""


def test_loop_report_counts_the_innermost_loop(cr):
    """Only the innermost loop (.L_x_2, inside .L_x_1) is reported, with its source line."""
    loops = cr.loop_report(SASS)
    assert [lp["label"] for lp in loops] == [".L_x_2"]
    lp = loops[0]
    assert lp["source"] == "fp8_gemm.py:199" and lp["instructions"] == 4
    assert (lp["HMMA"], lp["F2F"], lp["F2FP"], lp["LDGSTS"], lp["LDG"]) == (1, 1, 1, 0, 0)


@pytest.mark.parametrize("argv", [["qwen3-30b-a3b:4096", "--fp8a-tiles", "m128"],
                                  ["qwen3-30b-a3b:4096", "--gemm", "current", "--fp8", "weights", "--fp8a-tiles", "m128"]],
                         ids=["no-gemm", "weights-only"])
def test_fp8a_tiles_need_the_fp8a_gemms(cr, argv):
    """--fp8a-tiles names tile candidates of the fp8a GEMMs: it needs --gemm and --fp8 weights+act."""
    with pytest.raises(SystemExit) as e:
        cr.main(argv)
    assert e.value.code == 2
