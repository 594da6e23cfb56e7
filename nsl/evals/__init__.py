"""Evaluations of trained models: NLL, zero-shot tasks, probes."""
