"""Data larger than memory: shards written once by ``speedkit data prepare`` (:mod:`.prepare`), checked against
their index (:mod:`.shards`), and streamed by loaders on litdata (:mod:`.loaders`) that yield the in-memory
loaders' batches, resume mid-epoch exactly and split the data over ranks and worker processes.

litdata and tokenizers are the ``stream`` extra: ``pip install 'speedkit[stream]'``. Nothing here imports them
until used.
"""
from speedkit.data.streaming.shards import MANIFEST, ShardError, ShardSet, is_shard_folder, read_shards

__all__ = ["MANIFEST", "ShardError", "ShardSet", "StreamingImageLoader", "StreamingTokenLoader", "is_shard_folder",
           "prepare_images", "prepare_text", "read_shards"]


def __getattr__(name):  # the loaders and prepare import litdata/PIL/tokenizers only when asked for
    import importlib

    if name in ("StreamingImageLoader", "StreamingTokenLoader"):
        return getattr(importlib.import_module("speedkit.data.streaming.loaders"), name)
    if name in ("prepare_images", "prepare_text"):  # (the module .prepare holds prepare(), images or text)
        return getattr(importlib.import_module("speedkit.data.streaming.prepare"), name)
    raise AttributeError(name)
