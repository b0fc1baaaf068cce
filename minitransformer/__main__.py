"""``python -m minitransformer ...``: the same command line as ``minitransformer ...`` (see cli.py)."""

import sys

from .cli import main

sys.exit(main())
