"""The plain PyTorch MoE pipeline, the benchmark's baseline: router, sort, torch._grouped_mm,
activation, torch._grouped_mm, weighted index_add (torch imported where called).

Shape legend: T tokens, E experts, K top-k, H hidden, I expert width.
"""

from __future__ import annotations


def torch_route(x, w, cfg):
    import torch

    logits = (x @ w.router_weight.t()).float()
    if w.router_bias is not None:
        logits = logits + w.router_bias.float()
    K, E = cfg.top_k, cfg.num_experts
    if cfg.router == "softmax_topk":
        p = torch.softmax(logits, dim=-1)
        tw, ti = torch.topk(p, K, dim=-1)
        if cfg.norm_topk_prob:
            tw = tw / tw.sum(-1, keepdim=True)
    elif cfg.router == "topk_softmax":
        tl_, ti = torch.topk(logits, K, dim=-1)
        tw = torch.softmax(tl_, dim=-1)
    elif cfg.router == "sigmoid_top1_input":
        tl_, ti = torch.topk(logits, K, dim=-1)
        tw = torch.sigmoid(tl_)
    else:
        s = torch.sigmoid(logits)
        b = s + w.score_bias.float() if w.score_bias is not None else s
        if cfg.n_group > 1:
            T = b.shape[0]
            gs = b.view(T, cfg.n_group, -1).topk(2, dim=-1)[0].sum(-1)
            gi = gs.topk(cfg.topk_group, dim=-1)[1]
            keep = torch.zeros_like(gs).scatter_(1, gi, 1.0).repeat_interleave(E // cfg.n_group, dim=1)
            b = b.masked_fill(keep == 0, 0.0 if cfg.group_mask == "zero" else float("-inf"))
        ti = b.topk(K, dim=-1)[1]
        tw = s.gather(1, ti)
        if cfg.norm_topk_prob:
            tw = tw / (tw.sum(-1, keepdim=True) + 1e-20)
        tw = tw * cfg.routed_scaling_factor
    return tw, ti


def torch_moe(x, w, cfg):
    """The plain PyTorch layer: route, sort by expert, torch._grouped_mm twice, weighted index_add."""
    import torch
    import torch.nn.functional as F

    from .torch_ffn import gated_activation

    T, H = x.shape
    E, K, I = cfg.num_experts, cfg.top_k, cfg.intermediate_size
    tw, ti = torch_route(x, w, cfg)
    flat = ti.reshape(-1)
    order = torch.argsort(flat, stable=True)
    sorted_e = flat[order]
    tok = order // K
    counts = torch.zeros(E, device=x.device, dtype=torch.int32).scatter_add_(
        0, flat.to(torch.int64), torch.ones_like(flat, dtype=torch.int32))
    offs = torch.cumsum(counts, 0, dtype=torch.int32)
    xs = x[tok]
    wflat = tw.reshape(-1)[order]
    if cfg.weight_on_input:
        xs = (xs.float() * wflat[:, None]).to(x.dtype)
    h = torch._grouped_mm(xs, w.gate_up.transpose(1, 2), offs=offs)
    if w.gate_up_bias is not None:
        h = h + w.gate_up_bias[sorted_e]
    a = gated_activation(h, I, cfg.activation, cfg.swiglu_alpha, cfg.swiglu_limit)
    o = torch._grouped_mm(a.contiguous(), w.down.transpose(1, 2), offs=offs)
    if w.down_bias is not None:
        o = o + w.down_bias[sorted_e]
    if not cfg.weight_on_input:
        o = o * wflat[:, None].to(o.dtype)
    y = torch.zeros(T, H, device=x.device, dtype=x.dtype).index_add_(0, tok, o)
    if cfg.num_shared_experts:
        Is = cfg.shared_intermediate_size
        hs = x @ w.shared_gate_up.t()
        ys = (F.silu(hs[:, :Is]) * hs[:, Is:]) @ w.shared_down.t()
        if w.shared_gate is not None:
            ys = ys * torch.sigmoid(x @ w.shared_gate)[:, None]
        y = y + ys
    return y
