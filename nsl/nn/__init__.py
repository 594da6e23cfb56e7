"""The building blocks every family shares: attention and its rules (`attention`, `masks`), the
trunk's layers (`layers`), the KV cache (`kv_cache`) and μP scaling (`mup`). Below `nsl.decode`
and `nsl.models`; imports nothing from either."""
