"""The data side of the kit: text to token ids to padded batches, the bundled tasks, and BLEU."""
