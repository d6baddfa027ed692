"""``python -m megamoe.simulator``: the same as ``megamoe simulate``."""

import sys

from .cli import main

sys.exit(main())
