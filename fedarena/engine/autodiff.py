"""``fedarena.engine.autodiff`` moved to ``fedarena.engine.transforms.autodiff``; this path stays importable
(it is the same module object)."""

import sys

from .transforms import autodiff as _moved

sys.modules[__name__] = _moved
