"""``python -m pgcdc``: the same as the ``pgcdc`` command."""

import sys

from pgcdc.cli import main

sys.exit(main())
