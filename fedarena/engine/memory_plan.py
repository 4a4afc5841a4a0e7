"""``fedarena.engine.memory_plan`` moved to ``fedarena.engine.compiler.memory_plan``; this path stays importable
(it is the same module object)."""

import sys

from .compiler import memory_plan as _moved

sys.modules[__name__] = _moved
