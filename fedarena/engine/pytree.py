"""``fedarena.engine.pytree`` moved to ``fedarena.engine.core.pytree``; this path stays importable
(it is the same module object)."""

import sys

from .core import pytree as _moved

sys.modules[__name__] = _moved
