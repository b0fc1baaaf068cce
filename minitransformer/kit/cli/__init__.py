"""The command line, ``minitransformer COMMAND`` (or ``python -m minitransformer COMMAND``); ``--help`` on each.
parser.py registers the commands and their options, a module per command runs it. A mistake in what the user
typed or gave (an option out of its range in ``minitransformer.kit.limits``, a missing or crafted checkpoint) is one
line and exit code 2, never a traceback (MINITRANSFORMER_TRACEBACK=1 shows one)."""

import contextlib
import os
import sys
import traceback

from minitransformer.fast.threads import blas_threads, set_blas_threads
from minitransformer.kit.running.trainer import NonFiniteError

from .common import CLIError
from .parser import build_parser

# What each kind of error exits with: 2 for what the user gave, 1 for what happened while running.
_USER_ERRORS = (CLIError, FileExistsError, FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError,
                ValueError, TypeError)


def main(argv=None) -> int:
    """Run the command line; returns the exit code (0 success, 1 failure, 2 bad input, 130 interrupted)."""
    args = build_parser().parse_args(argv)            # exits with code 2 and the usage on bad arguments
    prog = f"minitransformer {args.command}"
    threads_before = blas_threads()                   # a command sets them for its model; a caller keeps its own
    try:
        return args.run(args)
    except KeyboardInterrupt:
        print(f"\n{prog}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:                           # `minitransformer ... | head`: the reader left
        with contextlib.suppress(OSError, ValueError, AttributeError):    # and no second error at exit
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (*_USER_ERRORS, NonFiniteError, MemoryError, OSError) as err:
        if os.environ.get("MINITRANSFORMER_TRACEBACK"):
            raise
        if isinstance(err, MemoryError):             # files are checked before allocating: a model too big to run
            frame = traceback.extract_tb(err.__traceback__)[-1]                  # the line that raised it
            where = f"in {frame.name}, {os.path.basename(frame.filename)} line {frame.lineno}"
            err = f"out of memory ({str(err) or where})"    # NumPy names the array; Python's own says nothing
        print(f"{prog}: error: {err}", file=sys.stderr)
        return 2 if isinstance(err, _USER_ERRORS) else 1
    finally:
        if threads_before is not None and blas_threads() != threads_before:
            set_blas_threads(threads_before)
