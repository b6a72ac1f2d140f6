"""Output judged by eye: how the figures look and how the report reads, kept as reviewed in tests/reviewed/.

A test compares what the code makes now with the reviewed file. After looking at a change and finding it right,
`HEADFORMS_REVIEWED=write` makes those tests replace the reviewed files with the new output (then review the diff)."""
import os
import shutil
from pathlib import Path

REVIEWED = Path(__file__).parent / "reviewed"


def reviewed_file(kind: str, name: str, made: Path) -> Path:
    """tests/reviewed/<kind>/<name>: the reviewed copy of `made` (replaced by it under HEADFORMS_REVIEWED=write)."""
    path = REVIEWED / kind / name
    if os.environ.get("HEADFORMS_REVIEWED") == "write":
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(made, path)
    return path
