"""``fedarena.engine.passes`` moved to ``fedarena.engine.compiler.passes``; this path stays importable
(it is the same module object)."""

import sys

from .compiler import passes as _moved

sys.modules[__name__] = _moved
