"""Data: text sources -> token shards (prepare) -> packed, host-sharded batches (pipeline)."""
