"""Where a results row came from: the GPU, the versions, the date and the code (``git_state``).

Pure Python but for ``provenance`` (torch and triton, for their versions and the GPU's name).
"""

from __future__ import annotations

import datetime as _dt
import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


class ProvenanceError(ValueError):
    """The commit given for a results row is not one anybody could check out."""


def _git(*argv: str, repo: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *argv], cwd=repo, capture_output=True, timeout=30)


def git_state(repo: Path = REPO) -> dict:
    """{"commit", "dirty", "diff_sha256"}: the code a results row was made with.

    ``diff_sha256``: SHA-256 of ``git diff HEAD --binary`` when dirty. Outside a checkout: from
    MEGAMOE_COMMIT, MEGAMOE_DIRTY and MEGAMOE_DIFF_SHA256, else ``commit`` is "unknown"."""
    import hashlib
    import re

    try:
        head = _git("rev-parse", "--verify", "HEAD", repo=repo)
        top = _git("rev-parse", "--show-toplevel", repo=repo)
        inside = head.returncode == 0 and Path(top.stdout.decode().strip()).resolve() == Path(repo).resolve()
    except (OSError, subprocess.SubprocessError):
        inside = False
    if inside:
        diff = _git("diff", "HEAD", "--binary", repo=repo).stdout
        return {"commit": head.stdout.decode().strip(), "dirty": bool(diff),
                "diff_sha256": hashlib.sha256(diff).hexdigest() if diff else None}
    commit = os.environ.get("MEGAMOE_COMMIT")
    if commit is None:
        return {"commit": "unknown", "dirty": None, "diff_sha256": None}
    if not re.fullmatch(r"[0-9a-f]{7,40}", commit):
        raise ProvenanceError(f"MEGAMOE_COMMIT={commit!r} is not a commit id (7 to 40 hex digits); give "
                              f"$(git rev-parse HEAD) and mark local changes with MEGAMOE_DIRTY=1 and "
                              f"MEGAMOE_DIFF_SHA256")
    dirty = os.environ.get("MEGAMOE_DIRTY")
    if dirty not in (None, "0", "1"):
        raise ProvenanceError(f"MEGAMOE_DIRTY={dirty!r} must be 0 or 1")
    sha = os.environ.get("MEGAMOE_DIFF_SHA256") or None
    if sha is not None and not re.fullmatch(r"[0-9a-f]{64}", sha):
        raise ProvenanceError(f"MEGAMOE_DIFF_SHA256={sha!r} must be 64 hex digits (sha256sum of git diff HEAD)")
    return {"commit": commit, "dirty": None if dirty is None else dirty == "1", "diff_sha256": sha}


def provenance() -> dict:
    """GPU, versions, date and ``git_state()`` (commit, dirty, diff_sha256) for a results row."""
    import torch
    import triton

    return {
        "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "triton": triton.__version__,
        **git_state(), "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
    }
