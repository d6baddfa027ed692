"""Hardware profiles and topology: the strict loader, overrides, the fabric graph."""

from __future__ import annotations

import copy
import json

import pytest

from megamoe.simulator.hardware import ProfileError, available_profiles, load_profile, override, parse_assignment
from megamoe.simulator.topology import build_topology, link_bytes, links_to_chips, stripe

SHIPPED = ("gb200-nvl72", "gb300-nvl72", "hgx-h200", "h200")


@pytest.mark.parametrize("name", SHIPPED)  # every profile the issue asks for loads and validates
def test_shipped_profiles_load(name):
    p = load_profile(name)
    assert p.name == name
    assert name in available_profiles()
    for sec in ("system", "switch", "link", "gpu", "sm", "hbm"):
        for key, entry in p.data[sec].items():
            assert entry["source"].strip(), f"{sec}.{key} has no source"
    # no TMA reader table (kernel_model.hbm_read_tma, optional): TMA reads price at the main table
    assert p.kernel.hbm_tma_programs == p.kernel.hbm_tma_bytes == p.kernel.hbm_tma_rate == ()
    assert p.kernel.sources["hbm_read_tma"].startswith("none")


def test_gb200_numbers_from_hardware_md():
    p = load_profile("gb200-nvl72")
    assert (p.num_gpus, p.num_switch_chips, p.links_per_gpu, p.num_sms) == (72, 18, 18, 148)
    assert p.links_per_gpu * p.link_bandwidth_bytes_per_s == pytest.approx(900e9)  # per direction
    assert p.tensor_flops_per_s == {"bf16": 2.5e15, "fp8": 5e15}
    assert p.data["link"]["latency_s"]["assumption"] is True  # no official NVLink latency


def _gb200_data():
    return copy.deepcopy(load_profile("gb200-nvl72").data)


def _write(tmp_path, data):
    f = tmp_path / "p.json"
    f.write_text(json.dumps(data))
    return f


@pytest.mark.parametrize(
    "mutate, needle",
    [
        (lambda d: d["link"].update(speed_bytes_per_s=d["link"]["latency_s"]), "link has unknown key(s) ['speed_bytes_per_s']"),  # typo'd key
        (lambda d: d["hbm"].pop("efficiency"), "hbm is missing key(s) ['efficiency']"),  # missing number
        (lambda d: d["link"]["latency_s"].update(unit="us"), "link.latency_s.unit must be 's'"),  # wrong unit
        (lambda d: d["gpu"]["num_sms"].update(value=148.5), "gpu.num_sms.value must be an integer"),  # count not integral
        (lambda d: d["link"]["payload_efficiency"].update(value=1.5), "link.payload_efficiency.value=1.5 is outside"),  # out of range
        (lambda d: d["hbm"]["bandwidth_bytes_per_s"].update(value="8e12"), "hbm.bandwidth_bytes_per_s.value must be a finite number"),  # string number
        (lambda d: d["sm"]["copy_bytes_per_s"].pop("source"), "sm.copy_bytes_per_s is missing 'source'"),  # every number needs a source
        (lambda d: d["gpu"]["gemm_efficiency"].update(points=[[128, 0.6], [512, 0.5]]), "gemm_efficiency.points[1] fraction must not decrease"),  # bound needs monotone curve
        (lambda d: d["gpu"]["gemm_efficiency"].update(points=[[128, 0.6], [64, 0.7]]), "gemm_efficiency.points[1] rows must increase"),
        (lambda d: d.update(format="v0"), "format must be"),
        (lambda d: d["system"]["num_gpus"].update(value=144), "switch.ports_per_chip=72 is fewer than the 144"),  # inconsistent fabric
    ],
)
def test_bad_profile_names_the_field(tmp_path, mutate, needle):
    d = _gb200_data()
    mutate(d)
    with pytest.raises(ProfileError) as e:
        load_profile(_write(tmp_path, d))
    assert needle in str(e.value)
    assert "p.json" in str(e.value)  # and the file


def test_bad_json_names_line(tmp_path):
    f = tmp_path / "p.json"
    f.write_text('{\n  "format": "megamoe.system/1",\n  oops\n}')
    with pytest.raises(ProfileError, match="line 3"):
        load_profile(f)


def test_unknown_profile_name():
    with pytest.raises(ProfileError, match="neither a shipped profile"):
        load_profile("gb999")


def test_user_profile_file_roundtrip(tmp_path):
    p = load_profile(_write(tmp_path, _gb200_data()))
    assert p.num_gpus == 72


def test_override_changes_and_marks_source():
    p = override(load_profile("gb200-nvl72"), gpus=36, link_bandwidth=25e9, sms=132)
    assert (p.num_gpus, p.link_bandwidth_bytes_per_s, p.num_sms) == (36, 25e9, 132)
    assert p.source("link.bandwidth_per_direction_bytes_per_s") == "override"
    assert "overridden" in p.name


@pytest.mark.parametrize(
    "fields, needle",
    [
        ({"gpus": 0}, "system.num_gpus.value=0 is outside"),  # bad value names the key
        ({"warp_speed": 2}, "unknown override 'warp_speed'"),  # unknown short name
        ({"link__colour_s": 1}, "not in the profile schema"),
    ],
)
def test_bad_override(fields, needle):
    with pytest.raises(ProfileError, match=needle):
        override(load_profile("gb200-nvl72"), **fields)


def test_parse_assignment():
    assert parse_assignment("link.latency_s=2e-6") == ("link__latency_s", 2e-6)
    assert parse_assignment("gpus=8") == ("gpus", 8)
    with pytest.raises(ProfileError, match="must be a number"):
        parse_assignment("gpus=eight")


@pytest.mark.parametrize(
    "name, gpus, chips, edges",
    [
        ("gb200-nvl72", 72, 18, 2 * 72 * 18),  # one link from every GPU to every chip
        ("hgx-h200", 8, 4, 2 * 8 * 4),  # 18 links over 4 chips: 5-5-4-4
        ("h200", 1, 0, 0),  # one GPU: no fabric
    ],
)
def test_topology_shape(name, gpus, chips, edges):
    g = build_topology(load_profile(name))
    kinds = [d["kind"] for _, d in g.nodes(data=True)]
    assert kinds.count("gpu") == gpus and kinds.count("switch") == chips
    assert g.number_of_edges() == edges


def test_hgx_links_and_stripe():
    assert links_to_chips(18, 4).tolist() == [5, 5, 4, 4]
    g = build_topology(load_profile("hgx-h200"))
    assert g[("gpu", 0)][("switch", 0)]["bandwidth_bytes_per_s"] == 5 * 25e9
    parts = stripe(g, 0, 3)
    up = {v: f for u, v, f in parts if u == ("gpu", 0)}
    assert up[("switch", 0)] == pytest.approx(5 / 18) and up[("switch", 3)] == pytest.approx(4 / 18)
    assert sum(up.values()) == pytest.approx(1.0)


def test_link_bytes_conserve():
    import numpy as np

    g = build_topology(load_profile("hgx-h200"))
    m = np.arange(64, dtype=float).reshape(8, 8)
    lb = link_bytes(g, m)
    up = sum(v for (a, b), v in lb.items() if a[0] == "gpu")
    down = sum(v for (a, b), v in lb.items() if b[0] == "gpu")
    off = m.sum() - np.trace(m)
    assert up == pytest.approx(off) and down == pytest.approx(off)


def test_every_gemm_loop_form_has_a_table_a_field_and_fallbacks_among_the_forms():
    """One list of GEMM tile-loop forms (reference.tiles.GEMM_LOOP_FORMS): the microbenchmark
    measures each, the profile has a table key and a KernelModel field for each, GEMM_LOADS' fallbacks
    name only forms, and the launch plan's stages and the megakernel's tasks read only forms."""
    import dataclasses

    import numpy as np

    from megamoe.calibrate.microbench_gemm import LOADS
    from megamoe.kernels.plan import launch_plan
    from megamoe.reference import MoEConfig
    from megamoe.reference.tiles import GEMM_LOOP_FORMS
    from megamoe.simulator.cost import MEGAKERNEL_LOADS
    from megamoe.simulator.hardware import _KM_TABLES, GEMM_LOADS, KernelModel

    forms = set(GEMM_LOOP_FORMS)
    assert set(LOADS) == forms and set(GEMM_LOADS) == forms
    assert all(set(fb) <= forms and fb[0] == name for name, fb in GEMM_LOADS.items())
    fields = {f.name for f in dataclasses.fields(KernelModel)}
    assert all(f"gemm_{n}" in _KM_TABLES and f"gemm_{n}" in fields for n in forms)
    assert {v for d in MEGAKERNEL_LOADS.values() for v in d.values()} <= forms
    cfg = MoEConfig.preset("qwen3-30b-a3b")
    for T in (1, 512, 4096):
        counts = np.bincount(np.arange(T * cfg.top_k) % cfg.num_experts, minlength=cfg.num_experts)
        plan = launch_plan(cfg, T, counts=counts, device_name="NVIDIA H200", dtype="bfloat16", triton_version="3.6.0")
        used = {s.loads for s in plan.stages if s.loads}
        assert used and used <= forms, (T, used)
