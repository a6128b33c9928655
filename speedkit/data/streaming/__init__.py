"""Data larger than memory: shards written once by ``speedkit data prepare``
(``speedkit.data.streaming.prepare``), checked against their index (``speedkit.data.streaming.shards``), and
streamed by loaders on litdata (``speedkit.data.streaming.loaders``) that yield the in-memory loaders' batches,
resume mid-epoch exactly and split the data over ranks and worker processes.

litdata and tokenizers are the ``stream`` extra: ``pip install 'torch-speedkit[stream]'``. Nothing here imports them
until used.
"""
from speedkit.data.streaming.loaders import StreamingImageLoader, StreamingTokenLoader
from speedkit.data.streaming.prepare import PrepareResult, PrepareStopped, prepare_images, prepare_text
from speedkit.data.streaming.shards import MANIFEST, ShardError, ShardSet, is_shard_folder, read_shards

__all__ = ["MANIFEST", "PrepareResult", "PrepareStopped", "ShardError", "ShardSet", "StreamingImageLoader",
           "StreamingTokenLoader", "is_shard_folder", "prepare_images", "prepare_text", "read_shards"]
