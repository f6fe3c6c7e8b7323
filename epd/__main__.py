"""``python -m epd`` is the same as the ``epd`` console script."""

import sys

from epd.cli import main

sys.exit(main())
