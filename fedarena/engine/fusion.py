"""``fedarena.engine.fusion`` moved to ``fedarena.engine.compiler.fusion``; this path stays importable
(it is the same module object)."""

import sys

from .compiler import fusion as _moved

sys.modules[__name__] = _moved
