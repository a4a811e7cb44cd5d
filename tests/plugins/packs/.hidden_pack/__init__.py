raise RuntimeError("hidden")
