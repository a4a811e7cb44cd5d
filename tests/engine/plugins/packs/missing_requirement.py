"""A pack whose third-party requirement is not installed."""

import loom_test_package_that_is_not_installed  # noqa: F401
