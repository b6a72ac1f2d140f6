"""A running extraction's progress, in a small JSON file beside the warehouse for `headforms status`.

The writer replaces the file atomically after every commit and removes it when the run ends; a
file whose process is gone is left by a killed run and is not reported as running.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path


def progress_path(db: str | Path) -> Path:
    """The side file of a warehouse: `<db>.progress.json`."""
    return Path(f"{db}.progress.json")


class RunProgress:
    """Counts of the current run (layers and heads committed, bytes fetched), written after each commit."""

    def __init__(self, db: str | Path | None, models: int):
        self.path = progress_path(db) if db is not None else None
        self.started = time.time()
        self.state = {"pid": os.getpid(), "started": self.started, "models": models, "models_done": 0,
                      "model": None, "n_layers": 0, "stack_layers": 0, "layers_done": 0, "heads_done": 0,
                      "bytes_fetched": 0}

    def model(self, name: str, n_layers: int, layers_done: int, stack_layers: int) -> None:
        """A model's `n_layers` layers with heads (a hybrid's attention layers, of its `stack_layers`) start being
        committed (`layers_done` of them were already stored)."""
        self.state.update(model=name, n_layers=n_layers, layers_done=layers_done, stack_layers=stack_layers)
        self._write()

    def layers(self, count: int, heads: int, bytes_fetched: int) -> None:
        """`count` layers of the current model, holding `heads` heads, were committed."""
        self.state["layers_done"] += count
        self.state["heads_done"] += heads
        self.state["bytes_fetched"] += bytes_fetched
        self._write()

    def model_done(self) -> None:
        self.state["models_done"] += 1
        self._write()

    def _write(self) -> None:
        if self.path is None:
            return
        elapsed = max(time.time() - self.started, 1e-9)
        state = self.state | {"updated": time.time(), "heads_per_second": self.state["heads_done"] / elapsed}
        tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(state))
        os.replace(tmp, self.path)

    def close(self) -> None:
        """The run ended (done, failed or interrupted): nothing is running any more."""
        if self.path is not None:
            self.path.unlink(missing_ok=True)


def running(db: str | Path) -> dict | None:
    """The progress of an extraction running on `db` now, or None (no run, or a killed one's stale file)."""
    try:
        state = json.loads(progress_path(db).read_text())
        os.kill(int(state["pid"]), 0)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return state
