"""Allow only the declared dependencies: an import finder that refuses every installed distribution which
``requirements.txt`` does not bring, directly or through what those distributions declare (extras excluded).

A module that imports an undeclared distribution works on a developer's machine, where it happens to be installed,
and fails on a new user's: with the guard installed it fails here too. Used by ``test_dependencies.py`` in fresh
interpreters (``python -c "from test import dependency_guard; dependency_guard.install(); ..."``).
"""

import importlib.abc
import importlib.metadata as md
import os
import re
import sys

from .helpers import REPO_ROOT

GUARD_MESSAGE = "no requirement brings it"


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _name_of(requirement: str) -> str:
    return _norm(re.split(r"[<>=!~;\[ (]", requirement.strip())[0])


def declared(path: str = os.path.join(REPO_ROOT, "requirements.txt")) -> set[str]:
    """Distributions ``path`` brings: its requirements and, transitively, what each declares (extras excluded)."""
    with open(path, encoding="utf-8") as f:
        todo = [_name_of(line.split("#")[0]) for line in f if line.split("#")[0].strip()]
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = md.requires(name) or []
        except md.PackageNotFoundError:
            continue
        todo += [_name_of(r) for r in requires if "extra ==" not in r]
    return seen


class _Guard(importlib.abc.MetaPathFinder):
    def __init__(self, forbidden: dict[str, list[str]]):
        self.forbidden = forbidden

    def find_spec(self, fullname, path=None, target=None):
        top = fullname.split(".")[0]
        if top in self.forbidden:
            raise ModuleNotFoundError(f"No module named {fullname!r} (installed here as {self.forbidden[top]}, "
                                      f"but {GUARD_MESSAGE}: declare it in requirements.txt)")
        return None


def install() -> None:
    """Refuse, from now on in this interpreter, every top-level module of an undeclared installed distribution."""
    allowed = declared()
    owners = md.packages_distributions()  # top-level module -> distributions that install it
    forbidden = {module: dists for module, dists in owners.items()
                 if module != "toolkit" and not any(_norm(d) in allowed for d in dists)}
    sys.meta_path.insert(0, _Guard(forbidden))
