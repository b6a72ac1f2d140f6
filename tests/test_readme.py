"""README.md: its links into docs/ name files that exist, its tour runs as printed on a model of the user's own
(a tiny random BERT saved where the tour's folder is), each command printing what the README shows below it, and
its queries to start from run on that model, and what it says the demo warehouse holds is what the demo holds."""
import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner

from headforms import cli
from tests import tiny_models

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
TOUR = re.compile(r"<!-- tour: begin[^>]*-->(.*?)<!-- tour: end -->", re.S)
DEMO = re.compile(r"<!-- demo: begin[^>]*-->\s*```console\n(.*?)^```", re.S | re.M)
QUERIES = re.compile(r"<!-- queries: begin[^>]*-->\s*```sh\n(.*?)^```", re.S | re.M)
FENCE = re.compile(r"^```(\w+)\n(.*?)^```$", re.S | re.M)
NUMBER = re.compile(r"\d+(?:[.,]\d+)*(?:e[-+]?\d+)?")
BOX_BORDER, BOX_ROW = tuple("┌╞├└"), "│"
MODELS = "~/models/"  # where the tour's model folder is; the test puts its tiny model there


def test_every_docs_link_exists():
    readme = README.read_text()
    links = set(re.findall(r"\]\((docs/[^)#\s]+)", readme))
    assert links, "the README links no file of docs/"
    missing = sorted(link for link in links if not (ROOT / link).is_file())
    assert not missing, f"README links missing files: {missing}"


def tour_blocks(readme: str) -> list[tuple[str, str]]:
    """The fenced blocks (language, text) between the README's tour markers."""
    tours = TOUR.findall(readme)
    assert len(tours) == 1, "the README has no (or more than one) <!-- tour: begin --> ... <!-- tour: end --> part"
    return FENCE.findall(tours[0])


def console_steps(block: str) -> list[tuple[str, list[str]]]:
    """A console block's commands (the lines after `$ `), each with the lines printed below it."""
    steps = []
    for line in block.splitlines():
        if line.startswith("$ "):
            steps.append((line[2:], []))
        else:
            assert steps, f"the tour prints {line!r} before any command"
            steps[-1][1].append(line.rstrip())
    return steps


def line_pattern(line: str) -> re.Pattern:
    """A printed line as a pattern: any number where it has one, anything where it has `…`."""
    parts = []
    for piece in line.split("…"):
        pos, out = 0, []
        for number in NUMBER.finditer(piece):
            out += [re.escape(piece[pos:number.start()]), r"[-+]?(?:\d+(?:[.,]\d+)*(?:e[-+]?\d+)?|inf|nan)"]
            pos = number.end()
        parts.append("".join(out) + re.escape(piece[pos:]))
    return re.compile(".*".join(parts))


def headers(lines: list[str]) -> list[list[str]]:
    """The column names of each box table in these lines (the row after its top border)."""
    return [[name.strip(" …") for name in re.split("[│┆]", row)[1:-1] if name.strip(" …")]
            for top, row in zip(lines, lines[1:]) if top.startswith("┌") and row.startswith(BOX_ROW)]


def check_printed(command: str, expected: list[str], output: str) -> None:
    """Every table's column names shown (in order, a subset where the README leaves columns out) and every other line
    shown, in order, with any numbers; table borders and rows are data of another model, and `…` stands for more."""
    printed = [line.rstrip() for line in output.splitlines()]
    shown, got = headers(expected), headers(printed)
    assert len(got) >= len(shown), f"{command}: the README shows {len(shown)} tables, it printed {len(got)}:\n{output}"
    for names, columns in zip(shown, got):
        it = iter(columns)
        assert all(name in it for name in names), f"{command}: columns {names} not among {columns}:\n{output}"
    at = 0
    for line in expected:
        if not line.strip() or line.startswith(BOX_BORDER) or line.startswith(BOX_ROW):
            continue
        pattern = line_pattern(line)
        found = next((i for i in range(at, len(printed)) if pattern.fullmatch(printed[i])), None)
        assert found is not None, f"{command}: the README shows {line!r}, not printed:\n{output}"
        at = found + 1


@pytest.fixture
def own_model(tmp_path, monkeypatch):
    """A tiny random BERT saved as the tour's model folder, and a fresh folder to run the tour in."""
    readme = README.read_text()
    folders = set(re.findall(re.escape(MODELS) + r"([\w.-]+)", "\n".join(b for _, b in tour_blocks(readme))))
    assert folders, f"the tour extracts no folder under {MODELS}"
    models = tmp_path / "models"
    for folder in folders:
        tiny_models.save(tiny_models.build("bert"), models / folder, "safetensors")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.delenv("HEADFORMS_DB", raising=False)
    return models


def test_the_tour_runs_as_printed(own_model, monkeypatch):
    """Each `headforms ...` line of the tour exits 0 and prints what the README shows; each Python block runs."""
    runner, ran, pythons = CliRunner(), [], 0
    for language, block in tour_blocks(README.read_text()):
        block = block.replace(MODELS, f"{own_model}/")
        if language == "python":
            printed = io.StringIO()
            with contextlib.redirect_stdout(printed):
                exec(compile(block, "README.md (tour)", "exec"), {})
            assert "parity" in printed.getvalue() and "layer" in printed.getvalue(), printed.getvalue()
            pythons += 1
            continue
        assert language == "console", f"the tour has a {language} block"
        for command, expected in console_steps(block):
            words = shlex.split(command)
            if words[0] == "export":
                name, _, value = words[1].partition("=")
                monkeypatch.setenv(name, value)
                continue
            assert words[0] == "headforms", f"the tour runs {command!r}: only headforms and export are run"
            result = runner.invoke(cli.main, words[1:])
            assert result.exit_code == 0, f"{command}: exit {result.exit_code}:\n{result.output}"
            check_printed(command, expected, result.output)
            ran.append(words[1])
    assert {"extract", "sql", "describe", "export", "report"} <= set(ran) and pythons, (ran, pythons)


def query_commands(block: str) -> list[list[str]]:
    """The commands of a shell block, a quoted argument running on over lines, `#` comments dropped."""
    commands, pending = [], ""
    for line in block.splitlines():
        pending += line + "\n"
        if pending.count('"') % 2 == 0:
            commands.append(shlex.split(pending, comments=True))
            pending = ""
    assert not pending, f"an unclosed quote in the README's queries: {pending!r}"
    return [words for words in commands if words]


def test_the_queries_to_start_from_run(own_model, monkeypatch):
    """Each of the README's queries to start from runs on the tour's model and prints rows."""
    blocks = QUERIES.findall(README.read_text())
    assert len(blocks) == 1, "the README has no (or more than one) <!-- queries: begin --> block"
    commands = query_commands(blocks[0])
    assert len(commands) >= 5, commands
    runner = CliRunner()
    monkeypatch.setenv("HEADFORMS_DB", "mine.duckdb")
    result = runner.invoke(cli.main, ["extract", str(next(own_model.iterdir()))])
    assert result.exit_code == 0, result.output
    for words in commands:
        assert words[:2] == ["headforms", "sql"], f"a query to start from runs {words}"
        result = runner.invoke(cli.main, words[1:])
        assert result.exit_code == 0, f"{words}: exit {result.exit_code}:\n{result.output}"
        assert re.search(r"^\d+ rows?", result.output, re.M) or "--format" in words, f"{words}: {result.output}"
        assert not re.search(r"^0 rows", result.output, re.M) and len(result.output.splitlines()) > 1, f"{words}: {result.output}"


def test_what_the_readme_says_of_the_demo_is_what_the_demo_holds(demo_db):
    """The README's output-value block, run on the warehouse `make warehouse` builds: every row as printed, each
    number to the digits shown (a changed statistic or view makes the README's account of the demo fail here)."""
    blocks = DEMO.findall(README.read_text())
    assert len(blocks) == 1, "the README has no (or more than one) <!-- demo: begin --> block"
    steps = console_steps(blocks[0])
    assert len(steps) >= 2, steps
    for command, expected in steps:
        words = shlex.split(command)
        assert words[:2] == ["headforms", "sql"], command
        result = CliRunner().invoke(cli.main, [*words[1:], "--db", str(demo_db)])
        assert result.exit_code == 0, f"{command}: exit {result.exit_code}:\n{result.output}"
        printed = [line.rstrip() for line in result.output.splitlines()]
        shown = [line for line in expected if line.startswith(BOX_ROW) or line[:1].isdigit()]
        got = [line for line in printed if line.startswith(BOX_ROW) or line[:1].isdigit()]
        assert len(got) == len(shown), f"{command}:\n{result.output}"
        for want, line in zip(shown, got):
            cells, values = re.split("[│┆]", want), re.split("[│┆]", line)
            assert len(cells) == len(values), (want, line)
            for cell, value in zip(cells, values):
                if NUMBER.fullmatch(cell.strip().lstrip("-")) and "." in cell:
                    digits = len(cell.strip().split(".")[1])
                    assert abs(float(cell) - float(value)) <= 0.5 * 10 ** -digits, (command, want, line)
                else:
                    assert cell.strip() == value.strip(), (command, want, line)
