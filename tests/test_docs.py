"""The docs' form: docs/methods.md states the methods as they are (no dated line: measurements and their history
live, dated, in docs/methods_notes.md), every section the code and docs cite exists, every module or name of the
product they cite is where they say, and docs/benchmarks.md gives each figure once, with one date per table row."""

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"

_MONTH = r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)[a-z]*\.?"
# an ISO date, a month-name date either way round ("Nov 20", "20 November"), a day of the month ("on the
# 25th"), and the relative days a log uses ("yesterday", "this session")
DATE = re.compile(
    r"\b20\d{2}-\d{2}-\d{2}\b"
    rf"|\b{_MONTH} \d{{1,2}}\b"
    rf"|\b\d{{1,2}} {_MONTH}(?:\s|$)"
    r"|\bthe \d{1,2}(?:st|nd|rd|th)\b"
    r"|(?i:\b(?:yesterday|today|tonight|this (?:session|morning|afternoon|evening))\b)"
)
ISO_DATE = re.compile(r"\b20\d{2}-\d{2}-\d{2}\b")


def _dated_lines(text: str) -> list[str]:
    return [f"{n}: {line}" for n, line in enumerate(text.splitlines(), 1) if DATE.search(line)]


@pytest.mark.parametrize("line", [
    "measured 2026-11-20 on the AMD machine",
    "the default since Nov 20",
    "run on 20 November",
    "as found on the 25th",
    "as measured yesterday",
    "in this session the step took",
    "today's defaults",
])
def test_date_pattern_catches_dates(line):
    assert DATE.search(line), line


@pytest.mark.parametrize("line", [
    "ResNet-8 on 8000 images, 3 epochs at batch 64 (He et al. 2016)",
    "the gate may skip a block; a sample that skipped gets none",
    "MobileNetV2 (CIFAR), ImageNet ResNet-18/34, §6.3 and §11.1",
    "`decay_after: [1, 2]`, a 64x16x32x32 tensor, 2^-17 of a step",
])
def test_date_pattern_spares_the_methods_vocabulary(line):
    assert not DATE.search(line), line


def test_methods_carries_no_date():
    """methods.md describes each method in the present tense; a dated line belongs on methods_notes.md."""
    dated = _dated_lines((DOCS / "methods.md").read_text(encoding="utf-8"))
    assert not dated, "dated lines in docs/methods.md (move them to docs/methods_notes.md):\n" + "\n".join(dated)


def test_methods_notes_entries_are_dated():
    """The lab-notes page keeps each entry under the date it was measured."""
    text = (DOCS / "methods_notes.md").read_text(encoding="utf-8")
    entries = [line for line in text.splitlines() if line.startswith("## ")]
    assert entries
    undated = [line for line in entries if not ISO_DATE.search(line)]
    assert not undated, undated


def _cited_sections() -> dict[str, set[str]]:
    """Section numbers cited as ``methods.md §6.3`` (or ``methods.md 6.3`` in YAML comments), with the files."""
    cite = re.compile(r"methods\.md,? §?(\d+(?:\.\d+)?)((?:(?:, | and |-)§?\d+(?:\.\d+)?)*)")
    cited: dict[str, set[str]] = {}
    for path in ROOT.rglob("*"):
        if path.suffix not in {".py", ".md", ".yaml", ".yml", ".toml", ".cfg", ".txt"} or not path.is_file():
            continue
        rel = path.relative_to(ROOT)
        if rel.parts[0].startswith(".") or "node_modules" in rel.parts:
            continue
        for m in cite.finditer(path.read_text(encoding="utf-8", errors="replace")):
            for number in [m.group(1), *re.findall(r"\d+(?:\.\d+)?", m.group(2))]:
                cited.setdefault(number, set()).add(str(rel))
    return cited


def test_every_cited_methods_section_exists():
    """Code comments and docs cite ``methods.md §N``; every cited number is a heading of docs/methods.md."""
    headings = set(re.findall(r"^#{2,3} (\d+(?:\.\d+)?)[. ]", (DOCS / "methods.md").read_text(encoding="utf-8"),
                              flags=re.M))
    cited = _cited_sections()
    assert {"1", "6.3", "6.5", "11.1"} <= cited.keys()
    missing = {number: sorted(files) for number, files in cited.items() if number not in headings}
    assert not missing, missing


# a dotted name of the product in backticks: a module, a name inside one (`results.summary.trends`), or a path of
# the experiment config whose section shares a package's name (`engine.compile`)
PRODUCT_NAME = re.compile(r"`((?:engine|orchestrator|results|dashboards|search_spaces|trainables)(?:\.[A-Za-z_]\w*)+)"
                          r"(?:\(\))?`")


def _config_path(name: str) -> bool:
    from pydantic import BaseModel

    from engine.config.experiment import ExperimentConfig

    model = ExperimentConfig
    for part in name.split("."):
        if not (isinstance(model, type) and issubclass(model, BaseModel)) or part not in model.model_fields:
            return False
        model = model.model_fields[part].annotation
    return True


def _resolves(name: str) -> bool:
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            if not hasattr(obj, attr):
                return _config_path(name)
            obj = getattr(obj, attr)
        return True
    return _config_path(name)


def test_every_product_name_the_docs_cite_exists():
    """A module or function named in the docs (`orchestrator.cli.failures.path_problem`) is where they say: a
    module that moves takes its mentions with it."""
    assert _resolves("results.summary.trends") and _resolves("engine.compile")
    assert not _resolves("results.summary.no_such") and not _resolves("search_spaces.trial.run_name")
    cited = {(path.name, m.group(1)) for path in [*sorted(DOCS.glob("*.md")), ROOT / "README.md"]
             for m in PRODUCT_NAME.finditer(path.read_text(encoding="utf-8"))
             if not m.group(1).endswith((".md", ".py", ".yaml", ".json"))}
    assert len(cited) > 10
    assert sorted((f, n) for f, n in cited if not _resolves(n)) == []


def test_benchmarks_rows_hold_one_date():
    """docs/benchmarks.md gives the current figure per machine: no table row mixes runs of several days."""
    rows = [line for line in (DOCS / "benchmarks.md").read_text(encoding="utf-8").splitlines()
            if line.startswith("|") and not set(line) <= set("|- ")]
    assert rows
    mixed = [row for row in rows if len(set(ISO_DATE.findall(row))) > 1]
    assert not mixed, mixed


# a path of the machine a page was made on: an absolute sqlite URI or file URI, or a scratch or home folder
MACHINE_PATH = re.compile(r"sqlite:////[A-Za-z]|file:///[a-z]|(?:^|[\s(`'\"])/(?:tmp|root|home|work)/")


def test_generated_results_pages_name_no_path_of_the_machine():
    """docs/results*.md are made by `fractune results`, which names a tracking store relative to the repository (or
    by its last two parts outside it): a reader's checkout is not the machine the study ran on."""
    pages = sorted(DOCS.glob("results*.md"))
    assert pages
    for page in pages:
        hits = [line[:120] for line in page.read_text().splitlines() if MACHINE_PATH.search(line)]
        assert not hits, (page.name, hits)
