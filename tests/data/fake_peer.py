"""A peer for the tests of ``--peer``: the routed experts in plain torch, megamoe's layouts.

x (T, H); w13 (E, 2I, H) gate rows then up rows; w2 (E, H, I); topk_weights (T, K) float32;
topk_ids (T, K) int32 -> y (T, H) in x's dtype. The hooks peer_table.py uses (shipped_config,
other_configs, prepare, run) are here too; a config's "chunk" only splits the top-k loop.
"""

import torch
import torch.nn.functional as F


def _experts(x, w13, w2, topk_weights, ids, chunk):
    I = w2.shape[2]
    y = torch.zeros(x.shape, device=x.device, dtype=torch.float32)
    for k0 in range(0, ids.shape[1], chunk):
        for k in range(k0, min(k0 + chunk, ids.shape[1])):
            h = torch.einsum("th,tnh->tn", x.float(), w13[ids[:, k]].float())
            a = F.silu(h[:, :I]) * h[:, I:]
            y += topk_weights[:, k, None] * torch.einsum("ti,thi->th", a, w2[ids[:, k]].float())
    return y.to(x.dtype)


def fused_experts(x, w13, w2, topk_weights, topk_ids):
    return _experts(x, w13, w2, topk_weights, topk_ids.long(), 1)


def shipped_config(T, E, I, H, K):
    return {"chunk": 1}, "fake default"


def other_configs(T, E, I, H, K):
    return {"fake-a": {"chunk": 2}, "fake-b": {"chunk": K}}


def prepare(topk_ids, config, num_experts):
    return topk_ids.long()


def run(x, w13, w2, topk_weights, topk_ids, config, state):
    return _experts(x, w13, w2, topk_weights, state, config["chunk"])
