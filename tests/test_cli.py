"""The front door: commands run, and bad commands say what is wrong."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from megamoe.cli import main


def test_info_lists_presets(capsys):
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "deepseek-v3" in out and "7168" in out and "megamoe" in out


def test_info_lists_a_profiles_assumptions(tmp_path, capsys):
    """``megamoe info --assumptions PROFILE``: every number flagged "assumption": true, with its
    source, and none that is not; a bad profile is a one-line error."""
    from megamoe.simulator.hardware import PROFILE_DIR, assumptions

    data = json.loads((PROFILE_DIR / "gb200-nvl72.json").read_text())
    flagged = {f"{s}.{k}" for s, keys in data.items() if isinstance(keys, dict)
               for k, e in keys.items() if isinstance(e, dict) and e.get("assumption") is True}
    rows = assumptions("gb200-nvl72")
    assert {r["path"] for r in rows} == flagged and "megakernel.router_topk_s" in flagged
    assert all(r["source"] for r in rows)
    data["megakernel"]["router_topk_s"].pop("assumption")
    (tmp_path / "p.json").write_text(json.dumps(data))
    assert "megakernel.router_topk_s" not in {r["path"] for r in assumptions(tmp_path / "p.json")}
    assert main(["info", "--assumptions", "gb200-nvl72"]) == 0
    out = capsys.readouterr().out
    assert f"{len(rows)} numbers taken as assumptions" in out and "router_topk_s" in out
    assert main(["info", "--assumptions", "no-such-profile"]) == 2
    assert "neither a shipped profile" in capsys.readouterr().err


def test_no_command_prints_help(capsys):
    assert main([]) == 0
    assert "simulate" in capsys.readouterr().out


def test_unknown_command_is_an_error(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["frobnicate"])
    assert exc.value.code == 2
    assert "invalid choice: 'frobnicate'" in capsys.readouterr().err


def test_console_script_entry_point():
    r = subprocess.run([sys.executable, "-m", "megamoe", "--version"], capture_output=True, text=True, check=True)
    assert r.stdout.startswith("megamoe ")


def _bench_row(**kw):
    row = {"preset": "qwen3-30b-a3b", "T": 64, "ours_us": 100.0, "deterministic": True}
    row.update(kw)
    return json.dumps(row)


@pytest.mark.parametrize("row, match", [
    (_bench_row(T=0), ":2: T=0 must be a whole number of tokens >= 1"),
    (_bench_row(T=-5), ":2: T=-5 must be a whole number of tokens >= 1"),
    (_bench_row(preset="gpt-5"), ":2: preset 'gpt-5' is not a preset"),
    (_bench_row(ours_us=0), ":2: ours_us=0 must be a positive time in us"),
    (_bench_row(dtype="int4"), ":2: dtype='int4' is not one of megamoe bench's (bf16, fp8, fp8-act)"),
])
def test_validate_from_bench_bad_rows(row, match, tmp_path, capsys):
    """Every row is checked before any prediction; the error names the file, line and value."""
    f = tmp_path / "b.jsonl"
    f.write_text(_bench_row() + "\n" + row + "\n")
    assert main(["validate", "--from-bench", str(f)]) == 2
    err = capsys.readouterr().err
    assert f"{f}{match}" in err and "Traceback" not in err


def test_validate_from_bench_unknown_system(tmp_path, capsys):
    f = tmp_path / "b.jsonl"
    f.write_text(_bench_row() + "\n")
    assert main(["validate", "--from-bench", str(f), "--system", "tpu-v9"]) == 2
    err = capsys.readouterr().err
    assert "--system: 'tpu-v9' is neither a shipped profile" in err and "Traceback" not in err


def test_project_errors_end_in_one_line(monkeypatch, capsys):
    """The top-level handler: a project input error raised anywhere in a subcommand is one line, exit 2."""
    import megamoe.simulator.cli as scli
    from megamoe.reference import InputError

    def boom(args):
        raise InputError("x has a non-finite value nan at index (0, 1)")

    monkeypatch.setattr(scli, "run", boom)
    assert main(["simulate"]) == 2
    assert capsys.readouterr().err == "megamoe simulate: error: x has a non-finite value nan at index (0, 1)\n"


def test_bugs_still_show_a_traceback(monkeypatch):
    import megamoe.simulator.cli as scli

    monkeypatch.setattr(scli, "run", lambda args: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        main(["simulate"])


@pytest.mark.parametrize("argv, match", [
    (["--sample", "-1"], "--sample must be >= 1 token, got -1"),
    (["--seed", "-1"], "--seed must be in [0, 2^32), got -1"),
])
def test_validate_bad_options(argv, match, capsys):
    assert main(["validate", "--models", "mixtral-8x7b", "--tokens", "1", *argv]) == 2
    assert match in capsys.readouterr().err


@pytest.mark.parametrize("cmd", [["-m", "megamoe.simulator", "--json"], ["-m", "megamoe", "simulate", "--json"]])
def test_a_reader_that_leaves_ends_the_command_quietly(cmd):
    """``... --json | head``: the reader closes the pipe before the output is written; the command
    ends with exit code 0 and no BrokenPipeError traceback."""
    import os

    r, w = os.pipe()
    os.close(r)  # the reader is gone before the first write
    try:
        p = subprocess.run([sys.executable, *cmd], stdout=w, stderr=subprocess.PIPE, text=True, timeout=300)
    finally:
        os.close(w)
    assert p.returncode == 0 and "Traceback" not in p.stderr and "BrokenPipe" not in p.stderr
