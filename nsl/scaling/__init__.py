"""Scaling-law analysis: run records or tables -> Chinchilla's three approaches -> multipliers and plots
(docs/guide/scaling.md).

`records` reads finished runs, `points` turns a grid root or a CSV/JSONL table into (N, D, loss, C)
points (with `--exclude` rules), `approaches` fits approaches 1 (envelope), 2 (IsoFLOP) and 3 (the
parametric law of `law`) with bootstrap intervals and identifiability verdicts, `fit` compares
families and writes the record, `plot` draws the figures. `grid` runs the grids. CLIs:
`python -m nsl.scaling.fit SOURCE`, `python -m nsl.scaling.plot --root=DIR`.
"""
