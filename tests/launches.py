"""A Triton kernel's launches recorded before they run, for the tests that hold the launch plan
against what the launchers really launch."""

from __future__ import annotations


class LaunchRecorder:
    """Stands in for a ``@triton.jit`` kernel ``fn``: each ``fn[grid](*args, **kw)`` appends
    (name, grid, its BLOCK_* and SWAP_AB keywords) to ``log``, then launches as before."""

    def __init__(self, fn, name: str, log: list):
        self.fn, self.name, self.log = fn, name, log

    def __getitem__(self, grid):
        launch = self.fn[grid]

        def run(*args, **kw):
            self.log.append((self.name, tuple(grid), {k: v for k, v in kw.items()
                                                      if k.startswith("BLOCK_") or k == "SWAP_AB"}))
            return launch(*args, **kw)

        return run
