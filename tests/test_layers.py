"""The import layers of `.importlinter`, checked with import-linter on the source tree: a
wrong-way import (ingest reaching into the web layer, a detector importing Flask) fails."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("app", "core", "ingest", "models", "migrations")  # installed as modalscope.<folder>


def _source_tree(tmp_path: Path) -> Path:
    """The package as Python sees it installed (the top-level folders under `modalscope`),
    built from the working tree, so the check reads the sources and not an installed copy."""
    pkg = tmp_path / "modalscope"
    pkg.mkdir()
    for module in (ROOT / "modalscope").glob("*.py"):
        shutil.copy(module, pkg / module.name)
    for folder in FOLDERS:
        (pkg / folder).symlink_to(ROOT / folder, target_is_directory=True)
    return tmp_path


def _lint(tree: Path, config: Path) -> subprocess.CompletedProcess:
    linter = Path(sys.executable).with_name("lint-imports")
    env = {**os.environ, "PYTHONPATH": str(tree), "NO_COLOR": "1"}
    return subprocess.run([str(linter), "--config", str(config), "--no-cache"], cwd=tree, env=env,
                          capture_output=True, text=True, timeout=300)


def test_imports_run_one_way(tmp_path):
    run = _lint(_source_tree(tmp_path), ROOT / ".importlinter")
    assert run.returncode == 0, run.stdout + run.stderr
    analyzed = int(re.search(r"Analyzed (\d+) files", run.stdout).group(1))
    assert analyzed > 80, run.stdout  # the whole tree, not an empty package
    assert "Contracts: 2 kept, 0 broken." in run.stdout


def test_a_wrong_way_import_breaks_the_build(tmp_path):
    tree = _source_tree(tmp_path)
    # a storage module that imports the web layer: the kind of import the layers forbid
    bad = tree / "modalscope" / "durations.py"
    bad.write_text(bad.read_text() + "\nfrom .app import params  # noqa\n")
    run = _lint(tree, ROOT / ".importlinter")
    assert run.returncode != 0 and "modalscope.durations -> modalscope.app" in run.stdout, run.stdout
