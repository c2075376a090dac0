"""Entry point: ``python -m operators --help``."""

import sys

from operators.cli import main

sys.exit(main())
