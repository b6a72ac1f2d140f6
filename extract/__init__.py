"""Checkpoints and their layouts: everything that knows where a head's W_Q and W_K live.

`open_checkpoint(source, ReadOptions(...))` resolves a source (local folder, GGUF file, `pkg:` reference,
hub id) to a `Checkpoint`; `Checkpoint.read_layer(i)` yields that layer's query and key
maps as float64 arrays, one layer in memory at a time. Imports nothing above it (no warehouse, no API).

Its rooms import one way, `sources.py -> formats/ -> layouts/ -> transport/ -> checkpoint.py`: the files a checkpoint
comes in, what a family's tensors mean, bytes, and the contract with the rest.
"""
from headforms.extract.checkpoint import Checkpoint, ExtractError, ModelSpec, ReadOptions
from headforms.extract.sources import MODEL_SETS, open_checkpoint

__all__ = ["Checkpoint", "ExtractError", "ModelSpec", "MODEL_SETS", "ReadOptions", "open_checkpoint"]
