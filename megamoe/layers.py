"""The device side of a validation run: a layer that makes weights and steered inputs, routes, runs
and times the kernels (``CudaLayer``: bf16 on the GPU; ``InterpreterLayer``: the CPU interpreter on
shrunken shapes, timing meaningless). T tokens, E experts, K top-k, H hidden.
"""

from __future__ import annotations

import dataclasses
import os
import time

from .grid import routing_bias, shrink_for_interpreter, steer_inputs


def has_cuda() -> bool:
    """Whether torch is installed and sees a CUDA GPU."""
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def cuda_alive() -> bool:
    """Whether the CUDA context still works (an illegal address or a device assert poisons it)."""
    import torch

    try:
        torch.cuda.synchronize()
        return float(torch.ones(1, device="cuda").add_(1).item()) == 2.0
    except Exception:  # noqa: BLE001 - any failure here means the context is gone
        return False


class CudaLayer:
    """Weights, steered inputs, the kernels' routing, forward and CUDA-graph timing, in bf16 on the GPU."""

    kind = "cuda"
    device = "cuda"

    def __init__(self):
        import torch

        self.torch = torch
        self.dtype = torch.bfloat16

    def config(self, preset: str):
        from megamoe.reference import MoEConfig

        return MoEConfig.preset(preset)

    def weights(self, cfg, seed: int):
        from megamoe.kernels.bench import random_device_weights

        return random_device_weights(cfg, seed)

    def device_name(self) -> str:
        return self.torch.cuda.get_device_name(0)

    def provenance(self) -> dict:
        from megamoe.kernels.bench import provenance

        p = provenance()
        p["num_sms"] = int(self.torch.cuda.get_device_properties(0).multi_processor_count)
        return p

    def inputs(self, cfg, w, T: int, routing: str, seed: int, n: int):
        """n steered inputs (T, H) and the weights with the steered router -> (xs, ws)."""
        torch = self.torch
        gen = torch.Generator(device=self.device).manual_seed(seed + T)
        base = [torch.randn((T, cfg.hidden_size), generator=gen, device=self.device, dtype=self.dtype) for _ in range(n)]
        xs, rw = steer_inputs(base, w.router_weight, routing_bias(cfg, routing, seed))
        return xs, dataclasses.replace(w, router_weight=rw)

    def routing(self, x, ws, cfg):
        """topk_idx (T, K) int32 as a NumPy array: the kernels' own router on x."""
        from megamoe import kernels

        return kernels.moe_forward_details(x, ws, cfg)["topk_idx"].cpu().numpy()

    def forward(self, x, ws, cfg, backend: str):
        from megamoe import kernels

        return kernels.moe_forward(x, ws, cfg, check=False, backend=backend)

    def time_us(self, cfg, ws, xs: list, backend: str, reps: int) -> float:
        """Median per-call us of the layer's CUDA graph (kernels.bench.graph_time_us); the SM clock
        and power sampled over its timed replays are left in ``last_clock`` (kernels.telemetry)."""
        from megamoe.kernels.bench import graph_time_us

        self.last_clock = {}
        return graph_time_us(lambda a: self.forward(a, ws, cfg, backend), list(xs), reps, clock=self.last_clock)

    def stage_us(self, cfg, ws, xs: list, reps: int, total_us: float, idle_s: float = 0.0) -> dict:
        """The multi-launch path's stages (kernels.bench.stage_split) from the times of its prefixes
        (``prefix_us``) and ``total_us``; each prefix after ``idle_s`` seconds idle where above 0."""
        from megamoe.kernels.bench import BREAKDOWN_STOPS, stage_split

        pre = {}
        for stop in BREAKDOWN_STOPS:
            if idle_s > 0:
                self.idle(idle_s)
            pre[stop] = self.prefix_us(cfg, ws, xs, reps, stop)
        return stage_split(pre, total_us)

    def prefix_us(self, cfg, ws, xs: list, reps: int, stop: str) -> float:
        """CUDA-graph time of the multi-launch path up to ``stop``, us."""
        from megamoe.kernels import moe as kmoe
        from megamoe.kernels.bench import graph_time_us

        return graph_time_us(lambda a: kmoe._forward(a, ws, cfg, True, stop), list(xs), reps)

    def idle(self, seconds: float) -> None:
        """Wait for the GPU's queued work, then leave it idle ``seconds``."""
        self.torch.cuda.synchronize()
        time.sleep(seconds)

    def rel_diff(self, y, ref) -> float:
        """||y - ref|| / ||ref|| in float32."""
        d = (y.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-30)
        return float(d.item())

    def sync(self) -> None:
        self.torch.cuda.synchronize()

    def alive(self) -> bool:
        return cuda_alive()

    def free(self) -> None:
        self.torch.cuda.empty_cache()

    def free_memory(self) -> float:
        return float(self.torch.cuda.mem_get_info()[0])

    def weight_bytes(self, cfg) -> float:
        from megamoe.reference.sizes import expert_bytes, router_bytes, shared_bytes

        return float(cfg.num_experts * expert_bytes(cfg, "bfloat16") + shared_bytes(cfg, "bfloat16")
                     + router_bytes(cfg, "bfloat16"))

    def job_bytes(self, cfg, T: int) -> float:
        """GPU memory estimated for a compile-ahead process of (cfg, T): weights and one forward's
        buffers, plus a quarter, plus 1.5 GB of context."""
        H, I, K, E = cfg.hidden_size, cfg.intermediate_size, cfg.top_k, cfg.num_experts
        KS = K + (1 if cfg.num_shared_experts else 0)
        fwd = (3 * T * H * 2 + T * KS * H * 4 + (T * K + min(E, T * K) * 128) * I * 2
               + T * cfg.shared_intermediate_size * 2)
        return self.weight_bytes(cfg) + 1.25 * fwd + 1.5e9


class InterpreterLayer(CudaLayer):
    """The same loop on the CPU under TRITON_INTERPRET=1, the preset shrunk, float32; ``time_us``
    is one call's wall time (meaningless)."""

    kind = "interpreter"
    device = "cpu"

    def __init__(self):
        os.environ.setdefault("TRITON_INTERPRET", "1")
        import torch

        self.torch = torch
        self.dtype = torch.float32

    def config(self, preset: str):
        return shrink_for_interpreter(super().config(preset))

    def weights(self, cfg, seed: int):
        from megamoe.reference import random_weights

        return random_weights(cfg, seed).to_torch(device="cpu", dtype=self.torch.float32)

    def device_name(self) -> str:
        return "cpu-interpreter"

    def provenance(self) -> dict:
        import datetime as dt

        import triton

        from megamoe.kernels.bench import git_state

        return {"gpu": "cpu-interpreter", "torch": self.torch.__version__, "triton": triton.__version__, **git_state(),
                "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), "num_sms": 132}

    def time_us(self, cfg, ws, xs: list, backend: str, reps: int) -> float:
        t = time.perf_counter()
        self.forward(xs[0], ws, cfg, backend)
        return (time.perf_counter() - t) * 1e6

    def idle(self, seconds: float) -> None:
        """Nothing to cool down on the CPU: the interpreter's loop does not wait."""

    def prefix_us(self, cfg, ws, xs: list, reps: int, stop: str) -> float:
        """One run's wall time up to ``stop`` (exercises the breakdown; measures nothing)."""
        from megamoe.kernels import moe as kmoe

        t = time.perf_counter()
        kmoe._forward(xs[0], ws, cfg, True, stop)
        return (time.perf_counter() - t) * 1e6

    def sync(self) -> None:
        pass

    def alive(self) -> bool:
        return True

    def free(self) -> None:
        pass

    def free_memory(self) -> float:
        return 64e9


def make_layer(kind: str) -> CudaLayer:
    if kind == "cuda":
        return CudaLayer()
    if kind == "interpreter":
        return InterpreterLayer()
    raise ValueError(f"layer kind must be 'cuda' or 'interpreter', got {kind!r}")


class WeightCache:
    """Each preset's weights made once and kept while they fit in ``limit_bytes``; the least
    recently used are dropped first (they are remade from the seed if needed again)."""

    def __init__(self, layer: CudaLayer, seed: int, limit_bytes: float):
        self.layer, self.seed, self.limit = layer, seed, limit_bytes
        self._held: dict[str, tuple] = {}  # preset -> (cfg, weights, bytes), in use order

    def get(self, preset: str):
        if preset in self._held:
            self._held[preset] = self._held.pop(preset)
            return self._held[preset][:2]
        cfg = self.layer.config(preset)
        need = self.layer.weight_bytes(cfg)
        while self._held and sum(b for *_, b in self._held.values()) + need > self.limit:
            self._held.pop(next(iter(self._held)))
            self.layer.free()
        w = self.layer.weights(cfg, self.seed)
        self._held[preset] = (cfg, w, need)
        return cfg, w
