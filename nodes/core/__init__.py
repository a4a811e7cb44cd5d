"""The shared floor every station builds on: reading model files, sampling-hook vocabulary, control values, resizing, prompt weights, device switches and block streaming. No Node classes."""
