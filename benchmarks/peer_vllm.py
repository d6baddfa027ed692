"""The ``--peer`` file for vLLM's Triton fused-MoE kernels (``megamoe bench --peer``, ``peer_table.py --peer``).

It wraps ``vllm_peer.py``: vLLM's ``fused_moe_kernel`` cut from its wheel and the host glue of its
unquantized ``fused_experts`` (config choice, ``moe_align_block_size``, the two launches, SiLU-and-mul,
the top-k sum). That file and its ``vendor/`` folder (the kernel and vLLM's shipped config files) are
vLLM's code and are never part of this repository: place them in ``.peer/`` at the checkout's root
(git-ignored) and set ``VLLM_PEER_VENDOR=$PWD/.peer/vendor``. Layouts are megamoe's (kernels/peer.py).

Besides ``fused_experts`` (vLLM as shipped, everything in the timed graph) it defines the hooks
``peer_table.py`` uses: ``shipped_config`` (vLLM's own choice on this GPU), ``other_configs`` (the
configs vLLM ships for the Hopper GPUs, for this shape), and ``prepare`` / ``run`` (the alignment
apart from the kernels, so that it can run before the graph as vLLM's CUDA op would).
"""

import importlib.util
import sys
from pathlib import Path

_PATH = Path(__file__).resolve().parents[1] / ".peer" / "vllm_peer.py"
if not _PATH.is_file():
    raise ImportError(f"{_PATH} is missing: put vLLM's extracted kernel and its host glue there (docs/kernels.md, "
                      f"'Comparing with a peer')")
_spec = importlib.util.spec_from_file_location("vllm_peer", _PATH)
vp = importlib.util.module_from_spec(_spec)
sys.modules["vllm_peer"] = vp
_spec.loader.exec_module(vp)

#: the Hopper GPUs whose shipped config files ``other_configs`` tries (a part of vLLM's device name)
HOPPER = ("H100", "H200", "H20", "H800", "GH200")


def fused_experts(x, w13, w2, topk_weights, topk_ids):
    return vp.vllm_fused_experts(x, w13, w2, topk_weights, topk_ids)


def shipped_config(T, E, I, H, K):
    """(config, where it came from): what vLLM picks on this GPU for this shape and T."""
    return vp.choose_config(T, E, I, H, K, None, return_source=True)


def other_configs(T, E, I, H, K):
    """{device[M key]: config}: the nearest-M entry of each bf16 config file vLLM ships for (E, I)
    and a Hopper GPU (its device name holds one of HOPPER)."""
    out = {}
    for f in sorted(Path(vp.CONFIG_DIR).glob(f"E={E},N={I},device_name=*.json")):
        dev = f.stem.split("device_name=", 1)[1]
        if "," in dev or not set(dev.split("_")) & set(HOPPER):
            continue  # a dtype or block-shape file, or not a Hopper GPU
        table = vp.get_moe_configs(E, I, None, dev)
        m = min(table, key=lambda k: abs(k - T))
        out[f"{dev}[{m}]"] = dict(table[m])
    return out


def prepare(topk_ids, config, num_experts):
    return vp.prepare_expert_assignment(topk_ids, config["BLOCK_SIZE_M"], num_experts)


def run(x, w13, w2, topk_weights, topk_ids, config, state):
    return vp.vllm_fused_experts(x, w13, w2, topk_weights, topk_ids, config1=config, assignment=state)
