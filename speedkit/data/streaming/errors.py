"""What the shard modules share at the bottom: the error a shard folder that cannot be used raises, and the names
of its files (:mod:`speedkit.data.streaming.shards` checks local folders, :mod:`speedkit.data.streaming.remote`
reads object stores; both use these)."""
from __future__ import annotations

MANIFEST = "speedkit-shards.json"
INDEX = "index.json"


class ShardError(ValueError):
    """A shard folder that cannot be used as it is: missing, partial where a whole one is needed, or altered."""
