"""The supported architectures of both formats, generated from the layout tables (`headforms architectures`).

docs/architectures.md's table is this module's `markdown()`; `python -m headforms.extract.layouts.architectures --write`
rewrites it there, and a test keeps the two equal.
"""
from __future__ import annotations

import sys
from pathlib import Path

from headforms.extract.layouts import gguf_table, latent
from headforms.extract.layouts.discover import discovered_families
from headforms.extract.layouts.table import LATENT_NORMS, LAYOUTS, REFUSED, Layout, _no_refusal

COLUMNS = ("format", "family", "positional", "packing", "score_scale", "notes")
TABLE_FILE = Path(__file__).resolve().parents[2] / "docs" / "architectures.md"
_BEGIN, _END = "<!-- architectures: begin (generated) -->", "<!-- architectures: end -->"


def _switched(layout: Layout, field: str, show) -> str:
    """A field's value, then each config variant that changes it ("; multi_query: ...")."""
    base = show(getattr(layout, field))
    return "; ".join([base] + [f"{v.when}: {show(v.fields[field])}" for v in layout.variants if field in v.fields])


def _hf_row(family: str, layout: Layout) -> dict:
    norms = [("", layout.qk_norm)] + [(f"{v.when}: ", v.fields["qk_norm"]) for v in layout.variants
                                      if "qk_norm" in v.fields]
    notes = [latent.TREATMENT if kind == LATENT_NORMS else f"{when}QK-norm ({kind} gains): refused unless --qk-norm fold"
             for when, kind in norms if kind]
    if layout.nope:
        notes.append(layout.nope.treatment)
    if layout.softcap:
        notes.append(f"soft-capped: the logit is cap * tanh(s / cap), cap = {layout.softcap} when set; the form "
                     "gives s (models.attention_softcap)")
    if layout.refusal is not _no_refusal:
        notes.append(f"refused when {layout.refusal.__doc__}")
    if "." in family:
        notes.append(f"tower {family.partition('.')[2]} (--tower)")
    return {"format": "hf", "family": family, "positional": _switched(layout, "positional", str),
            "packing": _switched(layout, "packing", lambda p: p.name), "score_scale": layout.scale.formula,
            "notes": "; ".join(notes)}


def _gguf_rows() -> list[dict]:
    """GGUF architectures, from gguf_table's own table."""
    return [{"format": "gguf", "family": arch, "positional": info.positional, "packing": info.packing,
             "score_scale": info.score_scale, "notes": info.notes}
            for arch, info in sorted(gguf_table.GGUF_ARCHITECTURES.items())]


def architectures(discovered: bool = True) -> list[dict]:
    """One row per supported family of either format, then the families refused by name and why; with
    `discovered`, then the families discovery has proven or refused on this machine (extract.layouts.discover)."""
    rows = [_hf_row(family, layout) for family, layout in sorted(LAYOUTS.items())] + _gguf_rows()
    rows += [{"format": "hf", "family": family, "positional": "", "packing": "", "score_scale": "",
              "notes": f"refused: {reason}"} for family, reason in sorted(REFUSED.items())]
    return rows + (discovered_families() if discovered else [])


def markdown(discovered: bool = True) -> str:
    """The architectures as a Markdown table (docs/architectures.md's: without the families discovered here)."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(row[c].replace("|", "\\|") for c in COLUMNS) + " |"
              for row in architectures(discovered)]
    return "\n".join(lines) + "\n"


def table_block(text: str) -> str:
    """The generated table as it stands in a document's text (between its markers)."""
    start, end = text.index(_BEGIN) + len(_BEGIN), text.index(_END)
    return text[start:end].strip("\n") + "\n"


def write_table(path: Path = TABLE_FILE) -> None:
    """Replace the document's table by a freshly generated one."""
    text = path.read_text()
    start, end = text.index(_BEGIN) + len(_BEGIN), text.index(_END)
    path.write_text(text[:start] + "\n" + markdown(discovered=False) + text[end:])


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        write_table()
    else:
        sys.stdout.write(markdown())
