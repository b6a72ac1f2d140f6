"""What a family's tensors mean: the layout tables, the config read as a ModelSpec, RoPE, norms, quantized weights."""
