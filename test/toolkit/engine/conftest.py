"""Fixtures shared by the engine tests."""

import pytest

from toolkit.distributed.context import destroy_distributed, init_distributed


@pytest.fixture(scope="module")
def one_rank():
    """A one-rank process group (gloo on the CPU) for the tests of one module: its rank context."""
    ctx = init_distributed(timeout_s=30)
    yield ctx
    destroy_distributed()
