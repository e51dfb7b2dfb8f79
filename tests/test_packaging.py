"""Every importable folder of the source tree is in pyproject's package list, so a wheel (the
Docker image installs one) carries all of it, not only what an editable install finds."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_every_package_folder_is_installed():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    folders = {name: Path(path) for name, path in config["package-dir"].items()}
    found = set()
    for name, path in folders.items():
        for init in (ROOT / path).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / path)
            found.add(".".join([name, *rel.parts]) if rel.parts else name)
    assert found - listed == set(), "missing from [tool.setuptools] packages"
