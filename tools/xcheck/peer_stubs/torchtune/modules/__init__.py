"""`RotaryPositionalEmbeddings` from the installed torchtune wheel's position_embeddings.py alone."""
import importlib.util, os, site
for _d in site.getsitepackages():
  _p = os.path.join(_d, "torchtune", "modules", "position_embeddings.py")
  if os.path.exists(_p):
    _spec = importlib.util.spec_from_file_location("torchtune_position_embeddings", _p)
    _mod = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_mod)
    RotaryPositionalEmbeddings = _mod.RotaryPositionalEmbeddings
    break
else:
  raise ImportError("torchtune's position_embeddings.py not found: pip install --no-deps torchtune==0.6.0")
