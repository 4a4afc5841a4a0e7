"""``fedarena.engine.native`` moved to ``fedarena.engine.compiler.native``; this path stays importable
(it is the same module object)."""

import sys

from .compiler import native as _moved

sys.modules[__name__] = _moved
