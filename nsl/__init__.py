"""nsl: pretraining research on transformers that separate state from prediction."""

__version__ = "0.1.0"
