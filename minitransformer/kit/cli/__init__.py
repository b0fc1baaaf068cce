"""The command line: ``minitransformer train | translate | evaluate | gradcheck | download``.

    minitransformer train --task copy --out runs/copy          # seconds; 100% exact match
    minitransformer train --task toy --out runs/toy            # minutes; English -> German, BLEU
    minitransformer translate --checkpoint runs/toy "the dog sees the cat ."
    minitransformer evaluate --checkpoint runs/toy --split test --beam-size 4
    minitransformer gradcheck                                  # every layer's finite-difference check
    minitransformer download --dir data/multi30k

``python -m minitransformer ...`` is the same. ``train`` writes into --out: metrics.json, checkpoint.npz
(plus checkpoint-<step>.npz, the last few), loss.png and attention.png. ``--resume`` continues a run
killed or stopped earlier from its checkpoint (the newest checkpoint-<step>.npz if checkpoint.npz is gone),
step for step with exactly the numbers the uninterrupted run would have (a time limit counts from the
resume), and with the run's own settings except the stop/report options typed on its command line. A fresh
run refuses an --out that holds a file it would write (checkpoints, metrics.json, plots); ``--overwrite``
removes the earlier run's files instead, once the new run's config, data and model are built.

``train`` builds the fast tier's model (``mt.fast.Transformer``); ``train --reference`` the readable core
(``mt.Transformer``), to step through a run; metrics.json says which ("tier"), and a resumed run keeps
its own. Both save the same state_dict, and ``translate`` and ``evaluate`` load any checkpoint into the fast tier.
``train --workers N`` (default 2; 1 with --reference) splits every batch across N threads, each with a replica
of the model (``fast.DataParallel``): the same loss and gradients; a resumed run keeps its count, which
decides its dropout masks.

BLAS threads: train, translate and evaluate choose them for the model (``common.choose_blas_threads``): one
per worker when training with several, else one for a model narrower than 256 (its products are small, and a second OpenBLAS thread fighting another process
for a core makes a step several times slower), the BLAS default (one per core) for wider ones. A count in
OPENBLAS_NUM_THREADS or OMP_NUM_THREADS wins; ``train`` prints the count and stores it in metrics.json.

Errors in what the user typed or gave (unknown task, a missing checkpoint, a damaged or crafted file, a run
folder whose files are symbolic links) give a one-line message and exit code 2, never a traceback; set
MINITRANSFORMER_TRACEBACK=1 to see one anyway. Every file a command writes is written atomically and never
through a symbolic link (``minitransformer.files``).

The modules: parser.py (the options), defaults.py (each task's tuned settings), one per command (train.py
with task_data.py, translate.py, evaluate.py, gradcheck.py, download.py), common.py (what several share).
"""

from __future__ import annotations

import os
import sys

from minitransformer.fast.threads import blas_threads, set_blas_threads
from minitransformer.kit.running.train import NonFiniteError

from .classroom import cmd_classroom  # classroom
from .common import CLIError
from .download import cmd_download
from .evaluate import cmd_evaluate
from .gradcheck import cmd_gradcheck
from .parser import build_parser
from .train import cmd_train
from .translate import cmd_translate

COMMANDS = {"train": cmd_train, "translate": cmd_translate, "evaluate": cmd_evaluate, "gradcheck": cmd_gradcheck,
            "download": cmd_download}
COMMANDS["classroom"] = cmd_classroom  # classroom

__all__ = ["COMMANDS", "CLIError", "build_parser", "main"]


def main(argv=None) -> int:
    """Run the command line; returns the exit code (0 success, 1 failure, 2 bad input, 130 interrupted)."""
    parser = build_parser()
    args = parser.parse_args(argv)          # exits with code 2 and the usage on bad arguments
    prog = f"minitransformer {args.command}"
    threads_before = blas_threads()         # a command sets them for its model; a caller in Python keeps its own
    try:
        return COMMANDS[args.command](args)
    except KeyboardInterrupt:
        print(f"\n{prog}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:                 # `minitransformer ... | head`: the reader left, nothing to report
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError, AttributeError):
            pass
        return 0
    except NonFiniteError as err:
        print(f"{prog}: {err}", file=sys.stderr)
        return 1
    except (CLIError, FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError, ValueError,
            TypeError) as err:
        if os.environ.get("MINITRANSFORMER_TRACEBACK"):
            raise
        print(f"{prog}: error: {err}", file=sys.stderr)
        return 2
    except MemoryError as err:              # files are checked before allocating: this is a model too big to run
        if os.environ.get("MINITRANSFORMER_TRACEBACK"):
            raise
        print(f"{prog}: error: out of memory ({err or 'no details'})", file=sys.stderr)
        return 1
    except OSError as err:                  # a network error of `download`, a full disk, ...
        if os.environ.get("MINITRANSFORMER_TRACEBACK"):
            raise
        print(f"{prog}: error: {err}", file=sys.stderr)
        return 1
    finally:
        if threads_before is not None and blas_threads() != threads_before:
            set_blas_threads(threads_before)
