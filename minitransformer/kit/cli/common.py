"""What several commands share: the user's mistakes, loading a trained run."""

import os

from minitransformer.kit.data.tokenizers import tokenizer_from_dict
from minitransformer.kit.running import checkpoint as ckpt
from minitransformer.kit.files import parse_json
from minitransformer.kit.running.runs import average_last, choose_blas_threads, tier
from minitransformer.model import TransformerConfig


class CLIError(Exception):
    """A mistake in what the user asked for: printed as one line, exit code 2."""


def tokenizers_from_checkpoint(ck):
    """(source, target) tokenisers saved with a run; (None, None) for a copy/reverse run, which has none.
    A checkpoint may come from anyone: a missing side, bad JSON or a bad vocabulary is a CLIError naming it."""
    if not ck.tokenizers:
        return None, None
    tokenizers = []
    for side in ("src", "tgt"):
        text = ck.tokenizers.get(side)
        if text is None:                                     # a present one is a string: load_checkpoint saw to it
            raise CLIError(f"checkpoint {ck.path} is missing tokenizers.{side} (the {side} vocabulary as JSON)")
        try:
            tokenizer = tokenizer_from_dict(parse_json(text, f"tokenizers.{side}"))
        except (ValueError, TypeError) as err:
            raise CLIError(f"checkpoint {ck.path}: {err}") from None
        # A vocabulary without a capital letter knows "the" but reads "The" as <unk>: such a model reads its input
        # lowercased (the toy corpus's vocabularies were saved before tokenisers said they lowercase).
        tokenizer.lowercase = tokenizer.lowercase or tokenizer.vocab.is_lowercase()
        tokenizers.append(tokenizer)
    return tuple(tokenizers)


def model_from_checkpoint(ck, weights=None):
    """The fast tier's model with the checkpoint's config and weights (or ``weights``), in eval mode.
    ``load_checkpoint`` checked the config's sizes against the weights the file holds before this builds it."""
    if ck.config is None:
        raise CLIError(f"checkpoint {ck.path} holds no model config")
    config = TransformerConfig.from_dict(ck.config)
    model = tier(reference=False)[0](config)                        # refused before it is built if it would not fit
    try:
        model.load_state_dict(ck.weights if weights is None else weights)
    except ValueError as err:
        raise CLIError(f"checkpoint {ck.path}: its weights do not fit its config ({err})") from None
    model.eval()
    return model


def load_run(path, average: int | None = None):
    """(checkpoint, model, src tokenizer, tgt tokenizer, the checkpoint files used) of a run folder or file, the
    BLAS threads set for its model. With ``average``: the weights are the mean of that many step checkpoints of the
    folder, those ending at the named file's step when it is a step file, else the newest."""
    file = ckpt.resolve_checkpoint(path)
    ck = ckpt.load_checkpoint(file)
    used, weights = [file], None
    if average is not None:
        used, weights = average_last(os.path.dirname(os.path.abspath(file)), average, ckpt.step_of_file(file))
    src_tok, tgt_tok = tokenizers_from_checkpoint(ck)
    model = model_from_checkpoint(ck, weights)
    choose_blas_threads(model.config)
    for side, tok in (("src", src_tok), ("tgt", tgt_tok)):    # else decoding would index out of range
        if tok is not None and tok.vocab_size != ck.config[f"{side}_vocab_size"]:
            raise CLIError(f"checkpoint {ck.path}: tokenizers.{side} has {tok.vocab_size} tokens but the model's "
                           f"config {side}_vocab_size is {ck.config[f'{side}_vocab_size']}")
    return ck, model, src_tok, tgt_tok, used
