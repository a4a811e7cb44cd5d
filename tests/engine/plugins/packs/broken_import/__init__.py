"""A pack that fails while importing."""


def _setup():
    raise RuntimeError("this pack is broken on purpose")


_setup()
