"""``minitransformer evaluate``: a checkpoint's BLEU, or a copy/reverse run's exact match, printed and saved as JSON."""

import os

from minitransformer.kit.data.task_data import bleu_of, load_pairs
from minitransformer.kit.data.tasks import TASKS as SEQUENCE_TASKS
from minitransformer.kit.data.tasks import SequenceTask, exact_match
from minitransformer.kit.running.checkpoint import step_of_file
from minitransformer.kit.files import check_writable, write_json

from .common import CLIError, load_run


def cmd_evaluate(args) -> int:
    ck, model, src_tok, tgt_tok, used = load_run(args.checkpoint, args.average)
    task = ck.extra.get("task")
    saved = ck.extra.get("settings")                                # checked as the file was read, if an object
    settings = saved if isinstance(saved, dict) else {}
    if task not in (*SEQUENCE_TASKS, "toy", "multi30k"):
        raise CLIError(f"checkpoint {used[-1]} does not say which task it was trained on (task={task!r:.60})")
    if task not in SEQUENCE_TASKS and src_tok is None:
        raise CLIError(f"checkpoint {used[-1]} holds no tokenisers; cannot evaluate a translation task")
    split = "heldout" if task in SEQUENCE_TASKS else args.split   # a sequence task has its held-out set
    json_path = os.path.abspath(args.json_path or os.path.join(os.path.dirname(used[-1]), f"eval-{split}.json"))
    check_writable(json_path, os.path.basename(json_path))          # before the scoring, not after it
    step = ck.step if args.average is None else step_of_file(used[-1])    # an averaged file's name says it
    decoding = "greedy" if args.beam_size == 1 else f"beam {args.beam_size}, alpha {args.alpha}"
    avg = f", average of {len(used)} checkpoints, steps {step_of_file(used[0])}-{step}" if args.average else ""
    result = {"checkpoint": used[-1] if args.average is None else used, "task": task, "split": split,
              "beam_size": args.beam_size, "alpha": args.alpha if args.beam_size > 1 else None,
              "averaged": len(used) if args.average else 1, "step": step}
    if task in SEQUENCE_TASKS:
        pairs = SequenceTask(task).heldout(settings.get("heldout", 1000))[: args.limit]
        score = exact_match(model, pairs, beam_size=args.beam_size, alpha=args.alpha)
        result.update(exact_match=score, sentences=len(pairs))
        print(f"exact match ({task}, {len(pairs)} held-out sequences, {decoding}{avg}): {100 * score:.2f}%")
    else:
        pairs = load_pairs(task, args.split, args.data_dir or settings.get("data_dir"))[: args.limit]
        lowercase = task == "multi30k"
        score, _ = bleu_of(model, src_tok, tgt_tok, pairs, lowercase, beam_size=args.beam_size, alpha=args.alpha)
        result.update(bleu=score, sentences=len(pairs), lowercase=lowercase)
        print(f"BLEU ({task} {args.split}, {len(pairs)} sentences, {decoding}{avg}"
              f"{', lowercased' if lowercase else ''}): {score:.2f}")
    write_json(json_path, result, "evaluation")
    return 0
