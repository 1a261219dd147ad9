"""docs/ keeps up with the code: every source file of the package has its
place in the request's trip (docs/architecture.md) or the design notes,
and every source path the docs name exists."""

from __future__ import annotations

import os
import re

from tests.helpers.proc_utils import ROOT

PACKAGES = ("ipc", "executor", "worker", "runner", "engine", "checkpoint", "serving", "launch")


def _docs_text() -> str:
    return "".join(open(os.path.join(ROOT, "docs", name), encoding="utf-8").read()
                   for name in ("architecture.md", "design.md"))


def _source_files() -> list[str]:
    found = []
    for package in PACKAGES:
        for folder, _, names in os.walk(os.path.join(ROOT, package)):
            found += [os.path.relpath(os.path.join(folder, n), ROOT) for n in names
                      if n.endswith(".py") and n not in ("__init__.py", "__main__.py")]
    return sorted(found)


def _named_in_its_folders_section(path: str, sections: list[str]) -> bool:
    """The file's name (a whole name: ``state.py`` is not ``request_state.py``)
    in a section of the docs that names its folder."""
    name = re.compile(r"(?<![\w/])" + re.escape(os.path.basename(path)))
    folder = os.path.dirname(path) + "/"
    return any(folder in section and name.search(section) for section in sections)


def test_every_source_file_is_named_in_the_docs():
    """By its path or, within a section that names its folder, by its name."""
    text = _docs_text()
    sections = re.split(r"\n(?=#{1,3} )", text)
    missing = [path for path in _source_files()
               if path not in text and not _named_in_its_folders_section(path, sections)]
    assert not missing, f"source files docs/ does not name: {missing}"


def test_every_path_the_docs_name_exists():
    sources = set(_source_files())
    pattern = r"\b(?:" + "|".join(PACKAGES) + r")/[\w/]+\.py\b"
    named = set(re.findall(pattern, _docs_text()))
    stale = sorted(p for p in named if p not in sources
                   and not os.path.exists(os.path.join(ROOT, p)))
    assert not stale, f"paths docs/ names that do not exist: {stale}"
