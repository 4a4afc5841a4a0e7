"""``fedarena.engine.vmap`` moved to ``fedarena.engine.transforms.vmap``; this path stays importable
(it is the same module object)."""

import sys

from .transforms import vmap as _moved

sys.modules[__name__] = _moved
