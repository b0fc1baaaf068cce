"""Train the toy English->German translator with the public API, on one page: the data, the model, the loss, Adam
with the Noam schedule, the training loop, greedy decoding and BLEU. `minitransformer train --task toy` is this
loop plus what a long run needs (checkpoints, resume, progress, plots).

    python examples/train_toy.py              # 800 steps, then the BLEU of 500 test translations
    python examples/train_toy.py --steps 50   # a quick look
"""

import argparse

import numpy as np

import minitransformer as mt
from minitransformer.kit.data import datasets
from minitransformer.kit.data.batching import collate
from minitransformer.kit.data.bleu import corpus_bleu
from minitransformer.kit.data.tokenizers import WordTokenizer

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--steps", type=int, default=800, help="optimiser steps (default 800)")
parser.add_argument("--batch-size", type=int, default=128, help="sentence pairs per step (default 128)")
parser.add_argument("--test-sentences", type=int, default=500, help="test sentences translated for BLEU")
parser.add_argument("--seed", type=int, default=0)
args = parser.parse_args()
mt.manual_seed(args.seed)                          # the weights' initialisation and dropout
rng = np.random.default_rng(args.seed)             # the order of the batches

# --- Data: (English, German) sentence pairs from a small grammar, a word vocabulary per language. --------------
train_text = datasets.load_toy("train")            # 6,000 pairs such as ("the dog sees a cat .", "der hund ...")
test_text = datasets.load_toy("test")[:args.test_sentences]
src_tok = WordTokenizer.build([en for en, _ in train_text], lowercase=True)
tgt_tok = WordTokenizer.build([de for _, de in train_text], lowercase=True)
train_ids = [(src_tok.encode(en), tgt_tok.encode(de)) for en, de in train_text]      # lists of token ids

# --- The model: the paper's architecture at a size a CPU trains in minutes. ----------------------------------------
config = mt.TransformerConfig(src_vocab_size=src_tok.vocab_size, tgt_vocab_size=tgt_tok.vocab_size, d_model=64,
                              num_heads=4, num_encoder_layers=2, num_decoder_layers=2, d_ff=128, dropout=0.1)
# The core: the model minitransformer/model.py shows line by line, so that every step below can be followed into
# it. mt.fast.Transformer is a drop-in (same config, same weights, faster steps) for when only the result matters.
model = mt.Transformer(config)
loss_fn = mt.CrossEntropyLoss(ignore_index=config.pad_id, label_smoothing=0.1)    # §5.4: label smoothing 0.1
optimizer = mt.optim.Adam(model.parameters(), betas=(0.9, 0.98), eps=1e-9)        # §5.3
schedule = mt.optim.NoamSchedule(optimizer, d_model=config.d_model, warmup=200)   # warm up, then decay as 1/sqrt(step)
print(f"{len(train_ids)} training pairs, vocabularies {src_tok.vocab_size} / {tgt_tok.vocab_size}, "
      f"{model.num_parameters():,} parameters")

# --- The loop: batch, forward, loss, backward, clip, step. -------------------------------------------------------
model.train()
for step in range(1, args.steps + 1):
    pairs = [train_ids[i] for i in rng.choice(len(train_ids), args.batch_size, replace=False)]
    batch = collate(pairs)         # src (B,S); tgt_in = <bos> y (B,T), tgt_out = y <eos> (B,T): predict the next word
    logits = model(batch.src, batch.tgt_in)        # (B,T,V)
    loss = loss_fn(logits, batch.tgt_out)          # mean over the real (non-pad) target tokens
    optimizer.zero_grad()
    model.backward(loss_fn.backward())             # every parameter's .grad
    mt.optim.clip_grad_norm(model.parameters(), max_norm=1.0)
    schedule.step()                                # sets the learning rate of this step
    optimizer.step()
    if step == 1 or step % 100 == 0 or step == args.steps:
        print(f"step {step:5d}  loss {loss:.3f}  lr {optimizer.lr:.2e}", flush=True)

# --- Greedy decoding of the test sentences, and their BLEU against the reference translations. -------------------
model.eval()                                       # dropout off
hypotheses = []
for start in range(0, len(test_text), 100):
    chunk = test_text[start:start + 100]
    src = collate([(src_tok.encode(en), []) for en, _ in chunk]).src           # (B,S), padded
    hypotheses += [tgt_tok.decode(ids) for ids in mt.decoding.greedy_decode(model, src)]
for (en, de), hyp in list(zip(test_text, hypotheses))[:3]:
    print(f"  {en}\n  -> {hyp}\n     ({de})")
print(f"test BLEU {corpus_bleu(hypotheses, [de for _, de in test_text]):.2f} on {len(test_text)} sentences")
