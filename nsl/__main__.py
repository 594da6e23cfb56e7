"""`python -m nsl`: the version, and what an nsl command runs with on this host (`nsl.hostmem`)."""

from nsl import __version__, hostmem

print(f"nsl {__version__}; host huge pages: {hostmem.status()}")
