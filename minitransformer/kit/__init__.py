"""The kit: everything around the two tiers, for running them. Neither tier imports it.

    data/      tokenizers, batching, datasets (Multi30k, the toy corpus in toy/), tasks (copy, reverse), bleu
    running/   trainer (Trainer), checkpoint (safetensors files), settings (one schema for a run's settings),
               runs (a run built from its settings), viz (plots), viewer (the explain page)
    classroom/ assignments made from the core, their grading, and their commands
    cli/       the ``minitransformer`` command line
    limits.py, files.py: the ground floor every part stands on (each option's range; safe reads, atomic writes)
"""
