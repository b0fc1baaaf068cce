"""``python -m minitransformer ...``: the same command line as ``minitransformer ...`` (see kit/cli/)."""

import sys

from .kit.cli import main

sys.exit(main())
