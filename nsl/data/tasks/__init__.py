"""Synthetic tasks written as prepared nsl data dirs (token shards + per-token label shards)."""
