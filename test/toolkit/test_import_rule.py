"""The package's import rule (docs: style.md): data flows one way, utils <- text <- dataset; utils <- models;
utils <- distributed <- engine; bin imports everything; dataset and models never import each other."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "toolkit"
ALLOWED = {"utils": {"utils"}, "text": {"text", "utils"}, "dataset": {"dataset", "text", "utils"},
           "models": {"models", "utils"}, "distributed": {"distributed", "utils"},
           "engine": {"engine", "distributed", "utils"}}


def toolkit_imports(path: Path):
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
        yield from (name.split(".")[1] for name in names if name.startswith("toolkit."))


@pytest.mark.parametrize("subpackage", sorted(ALLOWED))
def test_subpackage_imports_only_what_the_rule_allows(subpackage):
    files = sorted((PACKAGE / subpackage).rglob("*.py"))
    assert files
    wrong = {f"{path.relative_to(PACKAGE)} imports toolkit.{name}" for path in files
             for name in toolkit_imports(path) if name not in ALLOWED[subpackage]}
    assert not wrong
