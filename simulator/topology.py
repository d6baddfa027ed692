"""The NVLink fabric as a networkx graph: GPUs, switch chips, directed links.

Shape legend: G GPUs, C switch chips, L links per GPU.

Nodes ``("gpu", g)`` and ``("switch", c)``. GPU g's link l goes to chip ``l % C`` (NVL72: one link to
each of the 18 chips; HGX: 18 links over 4 chips, 5-5-4-4). Each direction is a directed edge with
``bandwidth_bytes_per_s`` (line rate of its links together, before payload efficiency),
``latency_s`` and ``num_links``. A transfer from GPU a to GPU b is striped over every chip in
proportion to the links the two GPUs have to it (``stripe``), which is how NVLink spreads traffic;
the switches are non-blocking, so the first-order contention is at the GPUs' send and receive
ports, which is what the flow model (``flows``) shares. The graph gives the per-link statistics.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .hardware import Profile

if TYPE_CHECKING:
    import networkx as nx


def gpu(g: int) -> tuple[str, int]:
    return ("gpu", int(g))


def switch(c: int) -> tuple[str, int]:
    return ("switch", int(c))


def build_topology(profile: Profile) -> nx.DiGraph:
    """The directed fabric graph of ``profile`` (one GPU: a single node, no edges)."""
    import networkx as nx  # here, not at import: ``megamoe simulate`` itself needs no graph (uniform_link_bytes)

    g_ = nx.DiGraph(name=profile.name)
    G, C, L = profile.num_gpus, profile.num_switch_chips, profile.links_per_gpu
    for g in range(G):
        g_.add_node(gpu(g), kind="gpu")
    if G == 1 or C == 0:
        return g_
    for c in range(C):
        g_.add_node(switch(c), kind="switch", ports=profile.switch_ports_per_chip)
    links = links_to_chips(L, C)
    for g in range(G):
        for c in range(C):
            n = int(links[c])
            if n == 0:
                continue
            attrs = dict(
                bandwidth_bytes_per_s=n * profile.link_bandwidth_bytes_per_s,
                latency_s=profile.link_latency_s / 2,  # half the GPU-to-GPU latency each hop
                num_links=n,
            )
            g_.add_edge(gpu(g), switch(c), **attrs)
            g_.add_edge(switch(c), gpu(g), **attrs)
    return g_


def links_to_chips(links_per_gpu: int, num_chips: int) -> np.ndarray:
    """(C,) int: links from one GPU to each chip, link l going to chip l % C."""
    return np.bincount(np.arange(links_per_gpu) % num_chips, minlength=num_chips)


def stripe(graph: nx.DiGraph, src: int, dst: int) -> list[tuple[tuple, tuple, float]]:
    """How a transfer src -> dst spreads over the fabric: [(u, v, fraction of bytes), ...].

    Every path is GPU -> chip -> GPU; the share of chip c is its capacity on that path over the sum.
    """
    if src == dst:
        return []
    a, b = gpu(src), gpu(dst)
    caps = []
    for _, c in graph.out_edges(a):
        if graph.has_edge(c, b):
            caps.append((c, min(graph[a][c]["bandwidth_bytes_per_s"], graph[c][b]["bandwidth_bytes_per_s"])))
    total = sum(w for _, w in caps)
    if total <= 0:
        raise ValueError(f"no path from GPU {src} to GPU {dst} in {graph.name!r}")
    out = []
    for c, w in caps:
        out.append((a, c, w / total))
        out.append((c, b, w / total))
    return out


def link_bytes(graph: nx.DiGraph, traffic_bytes: np.ndarray) -> dict[tuple, float]:
    """Bytes on every directed edge for a (G, G) byte matrix [src, dst] (diagonal stays local).

    Uses ``stripe``; since the stripe fractions depend only on the chips' link counts, they are
    the same for every pair on a uniform fabric, and the sum is done per GPU row and column.
    """
    G = traffic_bytes.shape[0]
    out = {e: 0.0 for e in graph.edges}
    if G == 1 or not out:
        return out
    off = traffic_bytes.astype(np.float64).copy()
    np.fill_diagonal(off, 0.0)
    sent, recv = off.sum(axis=1), off.sum(axis=0)
    # fractions of one representative pair; every GPU has the same links to every chip
    frac = {c: f for (u, c, f) in stripe(graph, 0, 1) if u == gpu(0)}
    for g in range(G):
        for c, f in frac.items():
            out[(gpu(g), c)] += sent[g] * f
            out[(c, gpu(g))] += recv[g] * f
    return out


def uniform_link_bytes(profile: Profile, traffic_bytes: np.ndarray) -> tuple[dict, dict, dict]:
    """``link_bytes`` without the graph, for this module's fabric (every GPU has the same links to
    every chip): (bytes per directed edge, bandwidth per directed edge, chip -> fraction of a transfer).

    Edges and fractions are keyed as in ``build_topology`` / ``stripe``.
    """
    G, C = profile.num_gpus, profile.num_switch_chips
    if G == 1 or C == 0:
        return {}, {}, {}
    links = links_to_chips(profile.links_per_gpu, C)
    chips = [c for c in range(C) if links[c] > 0]
    frac = {switch(c): float(links[c] / links[chips].sum()) for c in chips}
    off = traffic_bytes.astype(np.float64).copy()
    np.fill_diagonal(off, 0.0)
    sent, recv = off.sum(axis=1).tolist(), off.sum(axis=0).tolist()  # floats: G x C products below
    chip = [(switch(c), frac[switch(c)], int(links[c]) * profile.link_bandwidth_bytes_per_s) for c in chips]
    out, bw = {}, {}
    for g in range(G):
        node = gpu(g)
        for sw, f, b in chip:
            up, down = (node, sw), (sw, node)
            out[up] = sent[g] * f
            out[down] = recv[g] * f
            bw[up] = bw[down] = b
    return out, bw, frac
