"""``python -m fedarena`` is the ``fedarena`` command."""

from fedarena.platform.cli import main

raise SystemExit(main())
