"""``fedarena.engine.ir`` moved to ``fedarena.engine.core.ir``; this path stays importable
(it is the same module object)."""

import sys

from .core import ir as _moved

sys.modules[__name__] = _moved
