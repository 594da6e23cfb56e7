"""Stand-in for torchtune, first on the torch venv's path when tools/xcheck/peer_dd.py runs: the
real package's import needs torchao's nf4tensor, which the torchao on PyPI for torch 2.13 lacks.
Only `torchtune.modules.RotaryPositionalEmbeddings`, loaded from torchtune's own file
position_embeddings.py in the installed wheel (`pip install --no-deps torchtune==0.6.0`)."""
