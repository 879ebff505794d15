"""The test tiers: the markers of the slow tiers, and the folders whose every test belongs to one.

A developer's default after each change is the unit tier, ``python3 -m pytest test -m "not multiprocess and not
recipe"``; README's ``python3 -m pytest test -q`` runs every tier. Shared values and functions (the checkout's root,
the tiny corpora's entries, free ports, rank reports) are in ``test/helpers.py``, which worker scripts import too.
"""

from pathlib import Path

import pytest

TIERS = {
    "multiprocess": "starts several processes (torchrun ranks, two nodes on loopback) or trains for long",
    "recipe": "runs the recipe's run.sh end to end",
}
FOLDER_TIERS = {"multiprocess": "multiprocess", "recipes": "recipe"}  # test/<folder>/: every test in it
TEST_DIR = Path(__file__).resolve().parent


def pytest_configure(config: pytest.Config) -> None:
    for name, what in TIERS.items():
        config.addinivalue_line("markers", f"{name}: {what} (a slow tier; deselect with -m 'not {name}')")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        path = item.path.resolve()
        if path.is_relative_to(TEST_DIR):
            folder = path.relative_to(TEST_DIR).parts[0]
            if folder in FOLDER_TIERS:
                item.add_marker(FOLDER_TIERS[folder])
