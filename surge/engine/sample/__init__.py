"""Sampling: a batch's rows of parameters, logits processors (penalties, grammars, token rules),
the sampler and prompt log-probabilities."""
