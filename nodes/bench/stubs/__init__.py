"""Stub node packs without torch (a server's, a worker's) that the engine-level benchmarks run and
the server and distributed tests share."""
