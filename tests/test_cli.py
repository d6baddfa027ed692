"""The front door: commands run, and bad commands say what is wrong."""

from __future__ import annotations

import subprocess
import sys

import pytest

from megamoe.cli import main


def test_info_lists_presets(capsys):
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "deepseek-v3" in out and "7168" in out and "megamoe" in out


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
