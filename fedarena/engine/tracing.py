"""``fedarena.engine.tracing`` moved to ``fedarena.engine.core.tracing``; this path stays importable
(it is the same module object)."""

import sys

from .core import tracing as _moved

sys.modules[__name__] = _moved
