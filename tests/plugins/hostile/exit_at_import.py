"""A single-file pack that calls sys.exit() while it is imported."""

import sys

sys.exit(7)
