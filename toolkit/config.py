"""The former name of :mod:`toolkit.train_config` (until 2026-12-07), kept so that users' scripts that import it keep
working; new code imports ``toolkit.train_config``."""

from toolkit.train_config import Config, read_config  # noqa: F401
