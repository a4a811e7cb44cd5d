"""A single-file pack that raises KeyboardInterrupt while it is imported (issue 19)."""

raise KeyboardInterrupt("pretending the user pressed Ctrl-C inside a plugin")
