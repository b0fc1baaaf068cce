"""The running side of the kit: the training loop, checkpoints, safe file handling and plots."""
