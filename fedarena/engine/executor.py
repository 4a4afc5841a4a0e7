"""``fedarena.engine.executor`` moved to ``fedarena.engine.backends.numpy.executor``; this path stays importable
(it is the same module object)."""

import sys

from .backends.numpy import executor as _moved

sys.modules[__name__] = _moved
