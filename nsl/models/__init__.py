"""Model families: each expresses only its difference from the shared trunk (models/layers.py)."""
