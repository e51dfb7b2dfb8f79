"""The docs a newcomer reads: a short README whose settings table is the declared settings,
links that lead somewhere, and no text that reads as a development diary."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from modalscope.settings import DOCUMENTED

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _tracked_text_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    paths = [ROOT / p for p in out.splitlines()]
    return [p for p in paths if p.suffix in {".py", ".md", ".toml", ".ini", ".cfg", ".sh", ".txt", ""}
            and p.is_file() and p.name != "design.md"]  # the design card is quoted as written


def test_the_readme_is_a_short_guide_with_the_two_commands():
    assert len(README.splitlines()) < 300
    assert "python3 -m venv .venv && .venv/bin/pip install -e . && .venv/bin/modalscope demo" in README
    assert "\nscripts/test.sh\n" in README


def test_the_settings_table_is_the_declared_settings_with_their_defaults():
    table = dict(re.findall(r"^\| `([A-Z_]+)` \| ([^|]*) \|", README, re.M))
    assert set(table) == set(DOCUMENTED), (set(table) ^ set(DOCUMENTED))
    for name, shown in table.items():
        default = DOCUMENTED[name][0]
        if default:  # an empty default reads as "(unset)" or the behaviour it stands for
            assert shown.strip() == f"`{default}`", (name, shown, default)


def test_every_relative_link_in_the_docs_leads_to_a_file():
    for doc in [ROOT / "README.md", ROOT / "CHANGELOG.md", *(ROOT / "docs").glob("*.md")]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", doc.read_text()):
            if re.match(r"[a-z]+:", target):
                continue
            assert (doc.parent / target).exists(), f"{doc.name} links to {target}, which does not exist"


def test_nothing_names_a_work_session_or_an_issue_number():
    diary = re.compile(r"\bsessions? \d+|\bissues? #?\d+|\b(this|previous|next|last) session\b", re.I)
    hits = [f"{p.relative_to(ROOT)}:{n}: {line.strip()[:80]}"
            for p in _tracked_text_files()
            for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1) if diary.search(line)]
    assert not hits, "\n".join(hits)
