"""Scaling-law analysis: run records -> Chinchilla approach-3 fits -> multipliers and plots.

`records` reads finished runs (DESIGN "One record format"), `fit` fits
L(N, D) = E + A/N^α + B/D^β per family and compares families (REFERENCES §5), `plot` draws the
figures. Each is also a CLI: `python -m nsl.scaling.fit --root=DIR`, `python -m nsl.scaling.plot
--root=DIR`.
"""
