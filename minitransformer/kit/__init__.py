"""The kit: everything around the two tiers, for running them. Neither tier imports it.

    data/      tokenizers, batching, datasets (Multi30k, the toy corpus in toy/), tasks (copy, reverse), bleu
    running/   train (Trainer), checkpoint (safetensors files), files (safe reads and atomic writes), viz (plots)
    classroom/ assignments made from the core, and their grading
    cli/       the ``minitransformer`` command line
"""
