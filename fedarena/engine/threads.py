"""``fedarena.engine.threads`` moved to ``fedarena.engine.core.threads``; this path stays importable
(it is the same module object)."""

import sys

from .core import threads as _moved

sys.modules[__name__] = _moved
