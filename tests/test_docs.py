"""The project's text speaks of the project: the README stays a newcomer's page, and no README,
docs page, recipe or module refers to a numbered work session, a numbered issue or a path on a
particular machine. Figures live in docs/benchmarks.md with their command, date and machine;
history lives in CHANGELOG.md, by date.

Pure text checks: nothing is imported from specpipe and no model is loaded.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README_MAX_LINES = 350

# a numbered work session or issue (with a space, '#' or '-' before the number); paths of a machine
FORBIDDEN = {
    "a numbered session": re.compile(r"\bsessions?[ #-]*\d+", re.IGNORECASE),
    "a numbered issue": re.compile(r"\bissues?[ #-]*\d+", re.IGNORECASE),
    "a machine path": re.compile(r"(?<![\w.])/(?:work|root|tmp)/"),
}


def scanned_files() -> list[Path]:
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    files += sorted((ROOT / "recipes").rglob("*.yaml")) + sorted((ROOT / "recipes").rglob("*.yml"))
    files += sorted((ROOT / "specpipe").rglob("*.py"))
    return [f for f in files if f.is_file()]


def hits(path: Path) -> list[str]:
    """'path:line: what (the matched text)' for every forbidden string in the file."""
    found = []
    for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        for what, pattern in FORBIDDEN.items():
            for match in pattern.finditer(line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {what} ({match.group(0)!r})")
    return found


def test_the_readme_is_a_newcomers_page():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines (at most {README_MAX_LINES}): move reference material, "
        "tables and history into docs/ (benchmarks.md, CHANGELOG.md) and link to it")


def test_the_docs_pages_exist():
    for page in ("concepts", "engine", "proposers", "training", "benchmarks", "gpu", "contributing"):
        assert (ROOT / "docs" / f"{page}.md").is_file(), f"docs/{page}.md is missing"
    assert (ROOT / "CHANGELOG.md").is_file()


def test_the_text_names_no_session_issue_or_machine_path():
    found = [hit for path in scanned_files() for hit in hits(path)]
    assert not found, ("Write about the project, not the work log: dates instead of session or issue "
                       "numbers, words or paths inside the repository instead of a machine's paths.\n"
                       + "\n".join(found))


# the forbidden words are assembled here, so this file does not hold what it forbids
S, I = "sess" + "ion", "iss" + "ue"


@pytest.mark.parametrize("text, bad", [
    (f"measured in {S} 14 on this machine", True),
    (f"{S}s 23-24", True),
    (f"the draft-heads table ({I} 13)", True),
    (f"{I.capitalize()}-4 benchmark", True),
    ("out=/" + "work/qwen-run", True),
    ("python -m venv /" + "tmp/specenv", True),
    ("HOME=/" + "root/x", True),
    (f"measured on 2026-12-04 with a {S} of 20 prompts", False),
    ("a tissue of 3 layers", False),
    ("bench-results/tune, recipes/smollm2-135m", False),
    ("specpipe/engine/native.py", False),
])
def test_the_patterns(text, bad):
    assert any(p.search(text) for p in FORBIDDEN.values()) is bad


LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)\s]*)?\)")


def test_relative_links_point_to_files():
    missing = []
    for page in [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target in LINK.findall(page.read_text(encoding="utf-8")):
            if "://" not in target and not (page.parent / target).exists():
                missing.append(f"{page.relative_to(ROOT)}: {target}")
    assert not missing, "links to missing files:\n" + "\n".join(missing)
