"""Where headforms keeps what it caches (hub ranges, local revision digests): one folder, beside the Hugging Face
cache unless HEADFORMS_CACHE says otherwise."""
from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "HEADFORMS_CACHE"


def cache_root() -> Path:
    """$HEADFORMS_CACHE, else `headforms` in the Hugging Face cache (HF_HUB_CACHE, else HF_HOME/hub, as
    huggingface_hub resolves them), so a job given its own HF_HOME gets its own ranges too."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE).expanduser() / "headforms"
