"""A single-file pack that calls sys.exit() while it is imported (issue 19)."""

import sys

sys.exit(7)
