"""``minitransformer evaluate``: a checkpoint's BLEU, or a copy/reverse run's exact match, printed and saved as JSON."""

import os

from minitransformer.kit.data.task_data import load_pairs
from minitransformer.kit.data.tasks import TASKS as SEQUENCE_TASKS
from minitransformer.kit.data.tasks import SequenceTask
from minitransformer.kit.files import check_writable, write_json
from minitransformer.kit.running.checkpoint import step_of_file
from minitransformer.kit.running.runs import score
from minitransformer.kit.running.settings import TASKS

from .common import CLIError, load_run


def cmd_evaluate(args) -> int:
    ck, model, src_tok, tgt_tok, used = load_run(args.checkpoint, args.average)
    task = ck.extra.get("task")
    saved = ck.extra.get("settings")                                # checked as the file was read, if an object
    settings = saved if isinstance(saved, dict) else {}
    if task not in TASKS:
        raise CLIError(f"checkpoint {used[-1]} does not say which task it was trained on (task={task!r:.60})")
    if task in SEQUENCE_TASKS:                                      # scored on the run's held-out sequences
        split, pairs = "heldout", SequenceTask(task).heldout(settings.get("heldout", 1000))[: args.limit]
    elif src_tok is None:
        raise CLIError(f"checkpoint {used[-1]} holds no tokenisers; cannot evaluate a translation task")
    else:
        split, pairs = args.split, load_pairs(task, args.split, args.data_dir or settings.get("data_dir"))[: args.limit]
    json_path = os.path.abspath(args.json_path or os.path.join(os.path.dirname(used[-1]), f"eval-{split}.json"))
    check_writable(json_path, os.path.basename(json_path))          # before the scoring, not after it
    steps = [step_of_file(p) for p in used] if args.average else []     # an averaged file's name says its step
    scores, _ = score(model, task, pairs, (src_tok, tgt_tok), split, args.beam_size, args.alpha, steps)
    result = {"checkpoint": used[-1] if args.average is None else used, "task": task, "split": split,
              "beam_size": args.beam_size, "alpha": args.alpha if args.beam_size > 1 else None,
              "averaged": len(used), "step": steps[-1] if steps else ck.step, **scores, "sentences": len(pairs)}
    write_json(json_path, result, "evaluation")
    return 0
