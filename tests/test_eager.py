"""Eager calls (docs/kernels.md, "Eager calls"): the cached plans and workspaces give what a fresh
call gives, bitwise, whatever shapes, dtypes, backends and layers come between; T = 0; and the
routing error of ``moe_experts`` reported later without a host wait, naming token, slot and value.

On the ``device`` fixture (CUDA where there is a GPU, else the Triton interpreter); every output is
also compared with the float64 reference by normalized error.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from megamoe.reference import MoEConfig, assert_close, random_weights, round_to_dtype
from megamoe.reference import moe_forward as ref_forward

pytestmark = pytest.mark.interpret

#: two layers of different kinds: Qwen-like (softmax, no shared MLP) and DeepSeek-like (sigmoid groups, shared MLP)
QWEN = MoEConfig(hidden_size=40, intermediate_size=36, num_experts=7, top_k=3, name="qwen-like")
DEEPSEEK = MoEConfig(hidden_size=32, intermediate_size=24, num_experts=8, top_k=2, router="sigmoid_grouped_topk",
                     n_group=4, topk_group=2, routed_scaling_factor=2.5, score_bias=True, num_shared_experts=1,
                     shared_intermediate_size=20, name="deepseek-like")


@pytest.fixture(autouse=True)
def _no_pending_checks():
    """A routing check one test leaves pending is never reported by the next test's calls."""
    from megamoe.kernels import checks

    yield
    checks._pending.clear()


def _fresh(fn):
    """fn() with every eager cache dropped before and after."""
    from megamoe.kernels import moe

    moe.clear_caches()
    try:
        return fn()
    finally:
        moe.clear_caches()


def _dtype(device, half: bool) -> str:
    return device.half if half else device.dtype


# (config, T, half dtype, backend) in one process, in this order: shapes, dtypes, backends and
# layers alternate, and (QWEN, 5, main, multi) comes back after the others (its kept workspace again)
SEQUENCE = [(QWEN, 5, False, "multi"), (DEEPSEEK, 1, False, "megakernel"), (QWEN, 1, True, "multi"),
            (DEEPSEEK, 6, False, "multi"), (QWEN, 5, False, "megakernel"), (QWEN, 5, False, "multi")]


def test_cached_calls_are_fresh_calls(rng, device):
    """Every call of the sequence: the second (cached) call, a bind closure's and a fresh call's
    outputs are bitwise equal, and within the dtype's tolerance of the reference."""
    from megamoe.kernels import bind, moe_forward

    weights = {c.name: random_weights(c, seed=int(rng.integers(1 << 30))) for c in (QWEN, DEEPSEEK)}
    for cfg, T, half, backend in SEQUENCE:
        dt = _dtype(device, half)
        w = weights[cfg.name].to_torch(device.name, getattr(torch, dt))
        x = rng.standard_normal((T, cfg.hidden_size))
        xt = device.tensor(x, dt)
        first = moe_forward(xt, w, cfg, backend=backend)
        again = moe_forward(xt, w, cfg, backend=backend)
        bound = bind(w, cfg, backend=backend)(xt)
        graphed = bind(w, cfg, backend=backend, graphs=True)(xt)  # (the CPU: a plain call)
        fresh = _fresh(lambda: moe_forward(xt, w, cfg, backend=backend))  # noqa: B023 - called at once
        what = f"{cfg.name} T={T} {dt} {backend}"
        assert torch.equal(first, fresh) and torch.equal(again, fresh) and torch.equal(bound, fresh), what
        assert torch.equal(graphed, fresh), what
        assert_close(again.cpu(), ref_forward(round_to_dtype(x, dt), weights[cfg.name].round_to(dt), cfg), dt, what)


def test_two_layers_of_one_config_interleaved(rng, device):
    """Two layers (different weights, one config) share the kept workspace; alternating them gives
    each its own reference output, bitwise what a fresh call gives."""
    from megamoe.kernels import moe_forward

    ws = [random_weights(QWEN, seed=int(rng.integers(1 << 30))) for _ in range(2)]
    ts = [w.to_torch(device.name, device.torch_dtype()) for w in ws]
    x = rng.standard_normal((4, QWEN.hidden_size))
    xt = device.tensor(x)
    fresh = [_fresh(lambda t=t: moe_forward(xt, t, QWEN, backend="multi")) for t in ts]
    for i in (0, 1, 0, 1):
        y = moe_forward(xt, ts[i], QWEN, backend="multi")
        assert torch.equal(y, fresh[i]), f"layer {i}"
    for i in (0, 1):
        assert_close(fresh[i].cpu(), ref_forward(round_to_dtype(x, device.dtype), ws[i].round_to(device.dtype), QWEN),
                     device.dtype, f"layer {i}")


@pytest.mark.parametrize("backend", ["multi", "megakernel"])
def test_zero_tokens(device, backend):
    """T = 0: an empty (0, H) output from each entry, and the next call is unaffected."""
    from megamoe.kernels import bind, moe_experts, moe_forward

    w = random_weights(QWEN, seed=3).to_torch(device.name, device.torch_dtype())
    x = torch.zeros((0, QWEN.hidden_size), device=device.name, dtype=device.torch_dtype())
    assert moe_forward(x, w, QWEN, backend=backend).shape == (0, QWEN.hidden_size)
    assert bind(w, QWEN, backend=backend)(x).shape == (0, QWEN.hidden_size)
    idx = torch.zeros((0, QWEN.top_k), device=device.name, dtype=torch.int32)
    y = moe_experts(x, idx, idx.float(), w.gate_up, w.down, backend=backend)
    assert y.shape == (0, QWEN.hidden_size)


@pytest.mark.parametrize("T", [0, 2])
def test_fp8_scales_written_after_a_checked_call_are_read_again(device, T):
    """The weights are checked once per object, but an FP8 scale written in place since is read
    again by the next moe_forward (T = 0: only the checks run; T = 2: the call's kept signature)."""
    from megamoe.kernels import KernelInputError, moe_forward

    cfg = MoEConfig(hidden_size=128, intermediate_size=128, num_experts=4, top_k=2)
    w = random_weights(cfg, seed=0, fp8=True).to_torch(device.name, device.torch_dtype())
    x = torch.randn((T, 128), device=device.name, dtype=device.torch_dtype())
    moe_forward(x, w, cfg)
    moe_forward(x, w, cfg)  # checked already
    w.down_scale_inv[2, 0, 0] = float("nan")
    with pytest.raises(KernelInputError, match=r"weights.down_scale_inv .* must be finite and > 0, got nan"):
        moe_forward(x, w, cfg)


def test_a_kept_call_signature_keeps_every_check(rng, device, monkeypatch):
    """A moe_forward call of a signature seen before skips the weights' checks (kept per weights
    and config object, x's shape, dtype and device, and the options) but still refuses what a
    fresh call refuses; an unchecked call's signature never stands in for a checked one's; a
    new weights object (or an equal config object) is not taken for the old."""
    import gc

    from megamoe.kernels import KernelInputError, moe, moe_forward

    dt = device.torch_dtype()
    w = random_weights(QWEN, seed=5).to_torch(device.name, dt)
    x = device.tensor(rng.standard_normal((3, QWEN.hidden_size)), device.dtype)
    checked = []
    real = moe.check_weights
    monkeypatch.setattr(moe, "check_weights", lambda *a: (checked.append(1), real(*a)))
    moe.clear_caches()
    first = moe_forward(x, w, QWEN, check=False)
    assert torch.equal(moe_forward(x, w, QWEN, check=False), first) and not checked
    assert torch.equal(moe_forward(x, w, QWEN), first) and len(checked) == 1
    assert torch.equal(moe_forward(x, w, QWEN, fp8_activations=False), first) and len(checked) == 1
    with pytest.raises(KernelInputError, match="x must be contiguous"):
        moe_forward(x.t().contiguous().t(), w, QWEN)
    with pytest.raises(KernelInputError, match="fp8_activations must be True, False or None, got 0"):
        moe_forward(x, w, QWEN, fp8_activations=0)  # equal to False as a key, refused all the same
    with pytest.raises(KernelInputError, match="backend must be one of"):
        moe_forward(x, w, QWEN, backend="fast")
    assert torch.equal(moe_forward(x, w, QWEN.replace()), first)  # an equal config, another object
    w2 = random_weights(QWEN, seed=6).to_torch(device.name, dt)
    del w
    gc.collect()
    assert torch.equal(moe_forward(x, w2, QWEN), _fresh(lambda: moe_forward(x, w2, QWEN)))
    assert not torch.equal(moe_forward(x, w2, QWEN), first)


def test_bind_refuses_a_graphs_flag_not_bool(device):
    from megamoe.kernels import KernelInputError, bind

    w = random_weights(QWEN, seed=3).to_torch(device.name, device.torch_dtype())
    with pytest.raises(KernelInputError, match="graphs must be True or False, got 'yes'"):
        bind(w, QWEN, graphs="yes")


@pytest.mark.parametrize("backend", ["multi", "megakernel"])
def test_moe_experts_cached_matches_fresh(rng, device, backend):
    """moe_experts' kept plan and workspace across T values give a fresh call's output, the
    reference's within tolerance."""
    from megamoe.kernels import moe_experts
    from megamoe.reference import Routing, combine, experts_forward, plan_dispatch

    w64 = random_weights(QWEN, seed=5)
    w = w64.to_torch(device.name, device.torch_dtype())
    for T in (3, 7, 3):
        x = rng.standard_normal((T, QWEN.hidden_size))
        ids = np.stack([rng.permutation(QWEN.num_experts)[:QWEN.top_k] for _ in range(T)])
        tws = rng.uniform(0.1, 1.0, (T, QWEN.top_k))
        xt, idx = device.tensor(x), torch.as_tensor(ids).to(device.name)
        tw = torch.as_tensor(tws, dtype=torch.float32).to(device.name)
        y = moe_experts(xt, idx, tw, w.gate_up, w.down, backend=backend)
        fresh = _fresh(lambda xt=xt, idx=idx, tw=tw: moe_experts(xt, idx, tw, w.gate_up, w.down, backend=backend))
        assert torch.equal(y, fresh), f"T={T}"
        plan = plan_dispatch(ids, QWEN.num_experts)
        r = Routing(topk_idx=ids, topk_weights=tws, logits=np.zeros((T, QWEN.num_experts)))
        dt = device.dtype
        ref = combine(experts_forward(round_to_dtype(x, dt), r, plan, w64.round_to(dt), QWEN), plan, tws, QWEN)
        assert_close(y.cpu(), ref, dt, f"moe_experts {backend} T={T}")


class _Event:
    """A CUDA event's two calls the deferred check makes: query (no wait) and synchronize."""

    def __init__(self, done: bool):
        self.done, self.waited = done, False

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.waited, self.done = True, True


def _pending_bad_call(checks, event):
    """A pending check (as ``defer`` leaves it) of a call whose token 3, slot 1 names expert 10 of 7."""
    dev = "cuda" if torch.cuda.is_available() else "cpu"  # the check kernel runs where Triton can launch it
    idx = torch.as_tensor(np.array([[0, 1, 2]] * 5, dtype=np.int64)).to(dev)
    idx[3, 1] = 10
    tw = torch.full((5, 3), 0.5, device=dev)
    flag = checks.new_flag(dev)
    checks.launch_check(idx, tw, 7, flag)
    return checks._Pending("cuda:0", event, flag.cpu(), 7, 3, idx, tw)


def test_deferred_error_polled_without_a_wait(monkeypatch):
    """poll never waits: a check not yet done stays pending; once done, the next call's poll raises
    naming the earlier call's token, slot and value; check_routing waits for what is left."""
    from megamoe.kernels import KernelInputError, checks

    monkeypatch.setattr(checks, "_pending", {})
    monkeypatch.setattr(checks, "capturing", lambda dev: False)
    ev = _Event(done=False)
    checks._pending["cuda:0"] = __import__("collections").deque([_pending_bad_call(checks, ev)])
    checks.poll("cuda:0")  # not done: nothing raised, nothing waited for
    assert not ev.waited and len(checks._pending["cuda:0"]) == 1
    ev.done = True
    with pytest.raises(KernelInputError, match=r"earlier moe_experts call's routing on cuda:0: "
                                               r"topk_idx\[3, 1\] = 10 \(token 3, slot 1\) is outside \[0, 7\)"):
        checks.poll("cuda:0")
    assert not ev.waited and not checks._pending["cuda:0"]
    ev2 = _Event(done=False)
    checks._pending["cuda:0"].append(_pending_bad_call(checks, ev2))
    with pytest.raises(KernelInputError, match=r"topk_idx\[3, 1\] = 10"):
        checks.check_routing("cuda:0")
    assert ev2.waited and not checks._pending["cuda:0"]
    checks.check_routing("cuda:0")  # nothing left


def test_check_slots_are_reused_only_once_read(monkeypatch):
    """Each checked call takes a slot (flag, pinned row, event) made ahead; a slot goes back to the
    free list only when its check has been read, and a reused slot's flag starts cleared."""
    from megamoe.kernels import KernelInputError, checks

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    events = []

    def slots(key):  # the CPU stand-in of _new_slots: plain host rows, events we complete by hand
        flags, host = torch.empty((2, 8), dtype=torch.int64, device=key), torch.empty((2, 8), dtype=torch.int64)
        out = [checks._Slot(flags[i, :6], host[i, :6], _Event(done=False)) for i in range(2)]
        events.extend(s.event for s in out)
        return out

    for name, value in (("_pending", {}), ("_free", {}), ("_taken", {}), ("_templates", {}), ("_flags", {})):
        monkeypatch.setattr(checks, name, value)
    monkeypatch.setattr(checks, "_new_slots", slots)
    monkeypatch.setattr(checks, "capturing", lambda d: False)
    monkeypatch.setattr(checks, "_device_key", lambda d: torch.device(d).type)  # "cuda:0" and "cuda" alike
    monkeypatch.setattr(_Event, "record", lambda self, stream=None: None, raising=False)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: None)
    idx = torch.as_tensor(np.array([[0, 1, 2]] * 5, dtype=np.int64)).to(dev)
    tw = torch.full((5, 3), 0.5, device=dev)
    bad = idx.clone()
    bad[3, 1] = 10
    first = checks.call_flag(dev)
    checks.launch_check(bad, tw, 7, first)
    checks.defer(first, 7, 3, bad, tw)
    second = checks.call_flag(dev)
    assert second.data_ptr() != first.data_ptr()  # the first is in flight: not given again
    checks.launch_check(idx, tw, 7, second)
    checks.defer(second, 7, 3, idx, tw)
    checks.poll(dev)  # neither done: nothing read, nothing freed
    assert len(checks._pending[dev]) == 2 and not checks._free[dev]
    events[0].done = events[1].done = True
    with pytest.raises(KernelInputError, match=r"topk_idx\[3, 1\] = 10"):
        checks.poll(dev)
    assert len(checks._free[dev]) == 1  # the flagged call's slot, read
    checks.poll(dev)
    assert len(checks._free[dev]) == 2 and not checks._pending[dev]
    again = checks.call_flag(dev)
    assert again.data_ptr() in (first.data_ptr(), second.data_ptr())
    assert checks.describe_flag(again, 7, 3) is None  # cleared, though its last check was flagged or not


def test_deferred_error_message_from_the_flag_when_the_routing_changed(monkeypatch):
    """If the caller wrote its routing tensor after the call, the message takes the value from the
    flag itself (what the check saw), not from the changed tensor."""
    from megamoe.kernels import KernelInputError, checks

    monkeypatch.setattr(checks, "_pending", {})
    monkeypatch.setattr(checks, "capturing", lambda dev: False)
    p = _pending_bad_call(checks, _Event(done=True))
    p.topk_idx.fill_(0)  # bumps its version
    checks._pending["cuda:0"] = __import__("collections").deque([p])
    with pytest.raises(KernelInputError, match=r"topk_idx\[3, 1\] = 10 \(token 3, slot 1\)"):
        checks.poll("cuda:0")


def test_compiled_calls_never_poll(rng, device, monkeypatch):
    """Under torch.compile (fullgraph) the layer (a ``bind`` closure: torch 2.11's dynamo cannot
    rebuild the frozen MoEConfig that moe_forward takes) and moe_experts leave pending checks alone
    (an event query cannot be traced); the next eager call polls them."""
    from collections import deque

    from megamoe.kernels import bind, checks, moe_experts, moe_forward

    ev = _Event(done=False)
    queries = []
    ev.query = lambda: queries.append(1) or False
    monkeypatch.setattr(checks, "_pending", {str(torch.device(device.name, 0) if device.name == "cuda"
                                                 else torch.device("cpu")): deque([object()])})
    checks._pending[next(iter(checks._pending))][0] = _pending_bad_call(checks, ev)
    w = random_weights(QWEN, seed=19).to_torch(device.name, device.torch_dtype())
    x = device.tensor(rng.standard_normal((2, QWEN.hidden_size)))
    idx = torch.tensor([[0, 1, 2], [3, 4, 5]], device=device.name)
    tw = torch.ones((2, 3), device=device.name)
    layer = bind(w, QWEN)
    f = torch.compile(lambda a: layer(a) + moe_experts(a, idx, tw, w.gate_up, w.down),
                      fullgraph=True, backend="eager")
    f(x)
    assert not queries
    moe_forward(x, w, QWEN)
    assert queries


@pytest.mark.skipif(torch.cuda.is_available(), reason="the smoke run is the CPU interpreter's (the GPU runs it whole)")
def test_bench_host_smoke(tmp_path):
    """benchmarks/bench_host.py --smoke runs its measuring code on a tiny layer: rows for each entry,
    numerics within tolerance, cached equal to fresh, the bad routing reported."""
    import json

    from benchload import load_benchmark

    bench_host = load_benchmark("bench_host")
    out = tmp_path / "host.jsonl"
    rc = bench_host.main(["--smoke", "--presets", "qwen3-30b-a3b", "--tokens", "2", "--backends", "multi",
                          "--calls", "1", "--warmup", "2", "--out", str(out)])
    rows = [json.loads(s) for s in out.read_text().splitlines()]
    assert rc == 0
    by = {r["entry"]: r for r in rows}
    assert set(by) == {"moe_forward", "bind", "bind_graphs", "moe_experts", "cprofile", "cprofile_moe_experts"}
    for e in ("moe_forward", "bind", "bind_graphs", "moe_experts"):
        assert by[e]["err_ok"] and by[e]["same_as_uncached"] and by[e]["enqueue_us"] > 0, e
    for e in ("moe_forward", "bind", "moe_experts"):  # warm-up: a plain call, then the recording one
        assert (by[e]["tape_recordings"], by[e]["tape_refusals"], by[e]["tape_replays"]) == (1, [], 1), e
    assert (by["moe_forward"]["kept_hits"], by["bind"]["kept_hits"], by["moe_experts"]["kept_hits"]) == (1, 1, 0)
    assert by["moe_forward"]["enqueue_us_runner"] > 0 and "enqueue_us_runner" not in by["bind_graphs"]
    assert by["moe_experts"]["bad_routing_raised_by"] == "the call"  # the interpreter: synchronous
    assert "token 1, slot 0" in by["moe_experts"]["bad_routing_message"]
    assert "moe_forward" in by["cprofile"]["top20"]
    assert "moe_experts" in by["cprofile_moe_experts"]["top20"]


def test_bench_host_entries_in_the_order_asked(tmp_path):
    """--entries picks the entries and their order, one twice; an unknown name is refused by name."""
    import json

    from benchload import load_benchmark

    bench_host = load_benchmark("bench_host")
    out = tmp_path / "host.jsonl"
    rc = bench_host.main(["--smoke", "--presets", "qwen3-30b-a3b", "--tokens", "1", "--backends", "megakernel",
                          "--calls", "1", "--warmup", "2", "--entries", "bind,moe_forward,bind", "--out", str(out)])
    rows = [json.loads(s) for s in out.read_text().splitlines()]
    assert rc == 0
    assert [r["entry"] for r in rows if not r["entry"].startswith("cprofile")] == ["bind", "moe_forward", "bind"]
    for r in rows[:3]:  # each row records its own tape (the caches are dropped between rows) and replays it
        assert (r["tape_recordings"], r["tape_replays"], r["direct_launches"]) == (1, 1, 0), r["entry"]
    with pytest.raises(SystemExit):
        bench_host.main(["--smoke", "--entries", "bind,graphs"])


#: GPU clock cycles of the sleep queued before a call that must not wait (about 1 s on a Hopper GPU)
SLEEP_CYCLES = 2_000_000_000


def _returns_during_sleep(call, what: str) -> None:
    """Queue a long GPU sleep, then ``call()`` with PyTorch's synchronization detector raising: the
    call must return while the sleep still runs (its host time is in the message if not)."""
    import time

    torch.cuda.synchronize()
    torch.cuda._sleep(SLEEP_CYCLES)
    mark = torch.cuda.Event()
    mark.record()
    t0 = time.perf_counter()
    torch.cuda.set_sync_debug_mode("error")
    try:
        call()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    ms = (time.perf_counter() - t0) * 1e3
    assert not mark.query(), f"{what} returned only after the GPU sleep ended ({ms:.1f} ms in the call)"


@pytest.mark.gpu
def test_moe_experts_never_waits_and_reports_later(rng, device):
    """On the GPU: behind a long GPU sleep, a checked moe_experts call returns while the sleep still
    runs, both the call that records its launches and one that replays them; its bad routing is
    raised by check_routing, and another bad call's by the next call."""
    from megamoe.kernels import KernelInputError, check_routing, moe_experts

    w = random_weights(QWEN, seed=7).to_torch("cuda", torch.bfloat16)
    T = 9
    x = device.tensor(rng.standard_normal((T, QWEN.hidden_size)))
    idx = torch.as_tensor(np.stack([rng.permutation(QWEN.num_experts)[:QWEN.top_k] for _ in range(T)])).cuda()
    tw = torch.as_tensor(rng.uniform(0.1, 1.0, (T, QWEN.top_k)), dtype=torch.float32).cuda()
    bad = idx.clone()
    bad[4, 2] = -1
    for backend in ("multi", "megakernel"):
        moe_experts(x, idx, tw, w.gate_up, w.down, backend=backend)  # compiles
        check_routing("cuda")
        for which in ("recording", "replay"):
            _returns_during_sleep(lambda b=backend: moe_experts(x, bad, tw, w.gate_up, w.down, backend=b),
                                  f"{backend}: moe_experts ({which} call)")
            with pytest.raises(KernelInputError, match=r"topk_idx\[4, 2\] = -1 \(token 4, slot 2\)"):
                check_routing("cuda")
        moe_experts(x, bad, tw, w.gate_up, w.down, backend=backend)
        torch.cuda.synchronize()
        with pytest.raises(KernelInputError, match=r"earlier moe_experts call.*topk_idx\[4, 2\] = -1"):
            moe_experts(x, idx, tw, w.gate_up, w.down, backend=backend)
        check_routing("cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["multi", "megakernel"])
def test_graph_capture_after_eager_calls(rng, device, backend):
    """Eager calls fill the caches; a CUDA graph captured next keeps its own buffers: its replays on
    new inputs equal eager calls on them, and eager calls after the capture stay right."""
    from megamoe.kernels import moe_forward

    w = random_weights(DEEPSEEK, seed=11).to_torch("cuda", torch.bfloat16)
    xs = [device.tensor(rng.standard_normal((3, DEEPSEEK.hidden_size))) for _ in range(2)]
    want = [_fresh(lambda x=x: moe_forward(x, w, DEEPSEEK, backend=backend)) for x in xs]
    static = xs[0].clone()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            moe_forward(static, w, DEEPSEEK, backend=backend)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = moe_forward(static, w, DEEPSEEK, backend=backend)
    for x, y in zip(xs, want):
        static.copy_(x)
        g.replay()
        eager = moe_forward(x, w, DEEPSEEK, backend=backend)
        torch.cuda.synchronize()
        assert torch.equal(out, y) and torch.equal(eager, y)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["multi", "megakernel"])
def test_bound_graphs_replay_the_eager_call(rng, device, backend):
    """bind(..., graphs=True): per T a graph captured at the first call, replayed on new inputs,
    bitwise the plain call's y (a fresh tensor each call); other layers' eager calls in between
    (the megakernel's sync words: the graph owns its own) and T past GRAPH_MAX_TOKENS stay right."""
    from megamoe.kernels import bind, moe

    wa = random_weights(DEEPSEEK, seed=13).to_torch("cuda", torch.bfloat16)
    wb = random_weights(DEEPSEEK, seed=17).to_torch("cuda", torch.bfloat16)
    g, plain, other = (bind(wa, DEEPSEEK, backend=backend, graphs=True), bind(wa, DEEPSEEK, backend=backend),
                       bind(wb, DEEPSEEK, backend=backend))
    for T in (1, 5, 1, moe.GRAPH_MAX_TOKENS + 1, 5):
        for _ in range(2):
            x = device.tensor(rng.standard_normal((T, DEEPSEEK.hidden_size)))
            y = g(x)
            ob = other(x)
            want = plain(x)
            assert torch.equal(y, want), f"T={T}"
            assert torch.equal(ob, _fresh(lambda x=x: other(x))), f"T={T} other layer"
            assert y.data_ptr() != g(x).data_ptr()  # never the graph's own buffer
