"""The former name of :mod:`toolkit.utils.config_parsing` (until 2026-12-07), kept so that users' scripts that
import it keep working; new code imports ``toolkit.utils.config_parsing``."""

from toolkit.utils.config_parsing import *  # noqa: F401,F403
from toolkit.utils.config_parsing import ConfigError, apply_overrides, load_config  # noqa: F401
