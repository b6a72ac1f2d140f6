"""README.md's links into docs/ name files that exist (the README sends a newcomer there for the details)."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_every_docs_link_exists():
    readme = (ROOT / "README.md").read_text()
    links = set(re.findall(r"\]\((docs/[^)#\s]+)", readme))
    assert links, "the README links no file of docs/"
    missing = sorted(link for link in links if not (ROOT / link).is_file())
    assert not missing, f"README links missing files: {missing}"
