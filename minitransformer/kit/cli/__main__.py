"""``python -m minitransformer.cli ...``: the same as ``minitransformer ...``."""

import sys

from . import main

sys.exit(main())
