"""Checkpoints and their layouts: everything that knows where a head's W_Q and W_K live.

`open_checkpoint(source)` resolves a source (local folder, GGUF file, `pkg:` reference,
hub id) to a `Checkpoint`; `Checkpoint.read_layer(i)` yields that layer's query and key
maps as float64 arrays, one layer in memory at a time.
"""
import sys
import types

from headforms.extract.checkpoint import Checkpoint, ExtractError, ModelSpec
from headforms.extract.sources import MODEL_SETS, open_checkpoint

__all__ = ["Checkpoint", "ExtractError", "ModelSpec", "MODEL_SETS", "open_checkpoint"]


class _CallableModule(types.ModuleType):
    """`headforms.extract(sources, db=...)` is the API's extract; `headforms.extract.sources` etc. stay modules."""

    def __call__(self, *args, **kwargs):
        from headforms.api import extract

        return extract(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
