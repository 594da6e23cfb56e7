"""`make demo`: configs/tiny.py's model (2.7M parameters) for fewer steps, about a minute on 2 CPU cores.

The same 4-layer standard transformer, recipe and corpus as configs/tiny.py (which the tests and
the guide pages use), for half its steps: a fresh clone's `make demo` finishes in a few minutes,
its install included, and still ends well below the corpus's unigram entropy (README.md).
"""

from configs import tiny


def get_config():
  c = tiny.get_config()
  c.train.steps = 150
  # three validation points on the loss curve; a checkpoint at each, so an interrupted demo resumes
  c.train.eval_every = 50
  c.checkpoint.every = 50
  return c
