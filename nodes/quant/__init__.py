"""Weights kept in stored precision (fp8, scaled fp8, int8, GGUF) and computed in the compute
precision, for any family's torch module.

- :mod:`nodes.quant.packed`: :class:`PackedWeight`, one weight in stored precision, which key
  tables can split and join along rows;
- :mod:`nodes.quant.kernels`: dequantisation of every format and Loom's own fp8/int8 conversion;
- :mod:`nodes.quant.layers`: the layers that replace ``nn.Linear`` / convolutions / embeddings
  and dequantise per call (LoRA as a separate low-rank path);
- :mod:`nodes.quant.files`: reading fp8 and scaled-fp8 safetensors into packed weights;
- :mod:`nodes.quant.gguf`: reading (and writing) ``.gguf`` files, quantized weights as packed weights;
- :mod:`nodes.quant.storage`: UNETLoader's ``weight_dtype`` as a handle patch;
- :mod:`nodes.load.quant_loaders`: ComfyUI-GGUF's loader nodes.
"""
