"""The span record and its codes, as the ingest layer has always named them: they live in
:mod:`modalscope.core.spans` (the core types every layer shares)."""

from ..core.spans import *  # noqa: F401,F403 - the names importers of this module use
from ..core.spans import __all__  # noqa: F401
