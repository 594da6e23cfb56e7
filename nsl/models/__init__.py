"""Model families: each expresses only its difference from the shared trunk (nsl/nn/layers.py)."""
