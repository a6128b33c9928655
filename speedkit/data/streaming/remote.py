"""Shard folders in an object store: ``--data s3://bucket/prefix``.

The folder is the one ``speedkit data prepare`` wrote, uploaded as it is (``aws s3 sync DIR s3://bucket/prefix``).
Its manifest, each split's ``index.json`` and the tokenizer (text) are read from the store into a local cache
folder and checked as a local folder's are (a partial prepare refused unless allowed, chunks whose size differs
from their index refused, the same fingerprint), and litdata streams the chunks into the same cache folder as
the loaders read them:

    $SPEEDKIT_SHARDS/s3/<bucket>-<hash of the URL>/    (default ``~/.cache/speedkit/shards/s3/...``)

The store is any S3 one: AWS, or an S3-compatible store (MinIO, Cloudflare R2, Google Cloud Storage's S3 API)
through ``AWS_ENDPOINT_URL``. Credentials and region come from the usual AWS environment
(``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``, ``AWS_PROFILE``, ``~/.aws/``, an instance role), read by boto3;
speedkit adds nothing of its own. Only the objects under the URL the user named are read.

When the store's index of a split changed since it was cached (the shards were prepared again and uploaded),
the split's cached chunks are deleted before any is used: a cached chunk is never taken for another one.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
import warnings
from pathlib import Path
from typing import Optional

from speedkit.data.streaming.errors import INDEX, MANIFEST, ShardError

SCHEMES = ("s3",)
_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://(.*)$")
_ANNOUNCED: set = set()
UPLOAD_HINT = "prepare the shards locally, then upload the folder as it is: aws s3 sync DIR {url}"


def is_url(data) -> bool:
    """True for ``scheme://...`` (an object-store URL, whether or not speedkit reads its scheme)."""
    return isinstance(data, str) and _URL.match(data) is not None


def split_url(url: str) -> tuple[str, str]:
    """``(bucket, prefix)`` of an ``s3://bucket/prefix`` URL (prefix without slashes at its ends); a ShardError
    naming the schemes speedkit reads for any other."""
    match = _URL.match(url)
    if match is None:
        raise ShardError(f"{url} is not a URL; give a local shard folder or s3://bucket/prefix")
    scheme, rest = match.group(1).lower(), match.group(2)
    if scheme not in SCHEMES:
        raise ShardError(
            f"--data {url}: speedkit reads shard folders from a local folder or from "
            f"{', '.join(s + '://' for s in SCHEMES)} URLs (AWS S3, or an S3-compatible store such as MinIO, "
            f"Cloudflare R2 or Google Cloud Storage's S3 API, with AWS_ENDPOINT_URL set to its endpoint), not "
            f"{scheme}://; copy the shard folder to a local disk or to such a bucket")
    bucket, _, prefix = rest.partition("/")
    if not bucket:
        raise ShardError(f"--data {url} names no bucket; give s3://BUCKET/PREFIX, the folder `speedkit data "
                         f"prepare` wrote as uploaded")
    return bucket, prefix.strip("/")


def normalize(url: str) -> str:
    bucket, prefix = split_url(url)
    return f"s3://{bucket}/{prefix}" if prefix else f"s3://{bucket}"


def cache_folder(url: str) -> Path:
    """Where the shards at ``url`` are cached (see the module's docstring)."""
    url = normalize(url)
    bucket, _ = split_url(url)
    root = Path(os.environ.get("SPEEDKIT_SHARDS") or Path.home() / ".cache" / "speedkit" / "shards").expanduser()
    return root / "s3" / f"{bucket}-{hashlib.sha256(url.encode()).hexdigest()[:12]}"


def _endpoint() -> str:
    return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or "AWS S3 (no AWS_ENDPOINT_URL)"


def _client():
    """A boto3 S3 client from the usual AWS environment that fails fast: a wrong endpoint or missing credentials
    is an error in seconds, not after retries (litdata's own client retries at length for the chunks)."""
    try:
        import boto3
    except ImportError:
        raise ImportError("shards in an object store need boto3: pip install 'torch-speedkit[stream]' (litdata "
                          "brings it)") from None
    from botocore.config import Config

    return boto3.Session().client("s3", config=Config(connect_timeout=5, read_timeout=30,
                                                      retries={"max_attempts": 2, "mode": "standard"}))


def _explain(url: str, error: Exception) -> ShardError:
    """One clear error for what reading ``url`` raised: the URL, what is wrong, the fix."""
    from botocore import exceptions as E

    if isinstance(error, (E.NoCredentialsError, E.PartialCredentialsError)):
        return ShardError(f"--data {url}: no credentials for the object store ({error}); set AWS_ACCESS_KEY_ID and "
                          f"AWS_SECRET_ACCESS_KEY (or AWS_PROFILE, ~/.aws/credentials), as the aws command uses")
    if isinstance(error, (E.EndpointConnectionError, E.ConnectTimeoutError, E.ReadTimeoutError,
                          E.ConnectionClosedError)):
        return ShardError(f"--data {url}: cannot reach the object store at {_endpoint()} ({error}); check "
                          f"AWS_ENDPOINT_URL (for MinIO, R2 or GCS, their endpoint) and the network")
    if isinstance(error, E.ClientError):
        code = str(error.response.get("Error", {}).get("Code", ""))
        if code in ("NoSuchBucket", "404"):
            return ShardError(f"--data {url}: the bucket {split_url(url)[0]} does not exist at {_endpoint()}; check "
                              f"the URL (and AWS_ENDPOINT_URL), or upload the shards there: "
                              + UPLOAD_HINT.format(url=url))
        if code in ("AccessDenied", "403", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken",
                    "InvalidToken", "AllAccessDisabled"):
            return ShardError(f"--data {url}: the object store refused these credentials ({code}); check "
                              f"AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) and that they may read the "
                              f"bucket")
        return ShardError(f"--data {url}: the object store at {_endpoint()} answered {code or error}; check the "
                          f"URL and AWS_ENDPOINT_URL")
    if isinstance(error, E.BotoCoreError):
        return ShardError(f"--data {url}: cannot read the object store at {_endpoint()} ({error}); check "
                          f"AWS_ENDPOINT_URL, AWS_REGION and the credentials")
    raise error


def _list(client, bucket: str, prefix: str) -> dict[str, int]:
    """Every object under ``prefix/``: its name relative to the prefix -> its size in bytes."""
    start = f"{prefix}/" if prefix else ""
    sizes = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=start):
        for item in page.get("Contents", []):
            sizes[item["Key"][len(start):]] = int(item["Size"])
    return sizes


def _get(client, bucket: str, prefix: str, name: str) -> bytes:
    key = f"{prefix}/{name}" if prefix else name
    return client.get_object(Bucket=bucket, Key=key)["Body"].read()


@dataclasses.dataclass
class Fetched:
    """What was read from the store for a shard folder: the listing's sizes, the manifest (parsed), each split's
    index and the tokenizer as bytes; ``cache``: the folder they are cached in."""
    url: str
    cache: Path
    sizes: dict
    manifest: dict
    manifest_bytes: bytes
    indexes: dict
    tokenizer: Optional[str]
    tokenizer_bytes: Optional[bytes]


def fetch(url: str, parse_manifest) -> Fetched:
    """The manifest (checked with ``parse_manifest(raw, where)``), the indexes and the tokenizer of the shard folder
    at ``url``, and the sizes of every object under it; one clear ShardError for anything the store refuses."""
    url = normalize(url)
    bucket, prefix = split_url(url)
    client = _client()
    try:
        sizes = _list(client, bucket, prefix)
        if MANIFEST not in sizes:
            if not sizes:
                raise ShardError(f"--data {url}: nothing is stored under this prefix (at {_endpoint()}); check the "
                                 f"URL, or upload the shards: " + UPLOAD_HINT.format(url=url))
            raise ShardError(f"--data {url} is not a shard folder ({MANIFEST} is missing there); "
                             + UPLOAD_HINT.format(url=url))
        manifest_bytes = _get(client, bucket, prefix, MANIFEST)
        manifest = parse_manifest(manifest_bytes, url)
        indexes = {}
        for split in manifest["splits"]:
            name = f"{split}/{INDEX}"
            if name not in sizes:
                raise ShardError(f"{url}: the {split} split's {INDEX} is missing; upload the whole folder "
                                 f"`speedkit data prepare` wrote: " + UPLOAD_HINT.format(url=url))
            indexes[split] = _get(client, bucket, prefix, name)
        tokenizer = manifest.get("tokenizer")
        if tokenizer and tokenizer not in sizes:
            raise ShardError(f"{url}: {tokenizer} (the tokenizer the tokens were made with) is missing; upload the "
                             f"whole folder `speedkit data prepare` wrote: " + UPLOAD_HINT.format(url=url))
        tokenizer_bytes = _get(client, bucket, prefix, tokenizer) if tokenizer else None
    except ShardError:
        raise
    except Exception as e:  # botocore's, made one clear error
        raise _explain(url, e) from None
    return Fetched(url, cache_folder(url), sizes, manifest, manifest_bytes, indexes, tokenizer, tokenizer_bytes)


def check_sizes(fetched: Fetched, split: str, chunks: list) -> None:
    """Each chunk the index lists is in the store with the size the index says (the listing's sizes)."""
    url = fetched.url
    for chunk in chunks:
        name = f"{split}/{chunk['filename']}"
        size, expected = fetched.sizes.get(name), int(chunk["chunk_bytes"])
        if size is None:
            raise ShardError(f"{url}: {name} is missing but its index lists it; upload the whole folder again: "
                             + UPLOAD_HINT.format(url=url))
        if size != expected:
            what = "the upload was cut short" if size < expected else "it was replaced"
            raise ShardError(f"{url}: {name} holds {size} bytes but its index says {expected}: {what}; upload the "
                             f"folder `speedkit data prepare` wrote again: " + UPLOAD_HINT.format(url=url))


def store(fetched: Fetched) -> None:
    """The store's manifest, indexes and tokenizer in the cache folder; a split whose index changed loses its
    cached chunks first (they may be another preparation's). Says once a process where the chunks go."""
    from speedkit.record.runs import atomic_write_bytes

    cache = fetched.cache
    cache.mkdir(parents=True, exist_ok=True)
    for split, raw in fetched.indexes.items():
        split_dir = cache / split
        old = split_dir / INDEX
        if old.is_file() and old.read_bytes() != raw:
            stale = [p for p in split_dir.iterdir() if p.name != INDEX]
            if stale:
                warnings.warn(f"{cache}: the store's {split} shards changed since they were cached; deleting the "
                              f"{len(stale)} cached file(s) of the old ones", stacklevel=3)
            for path in stale:
                shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
        split_dir.mkdir(parents=True, exist_ok=True)
        if not old.is_file() or old.read_bytes() != raw:
            atomic_write_bytes(old, raw)
    if fetched.tokenizer_bytes is not None:
        atomic_write_bytes(cache / fetched.tokenizer, fetched.tokenizer_bytes)
    atomic_write_bytes(cache / MANIFEST, fetched.manifest_bytes)
    if fetched.url not in _ANNOUNCED:  # once a process: where the chunks go, and how to move them
        _ANNOUNCED.add(fetched.url)
        warnings.warn(f"{fetched.url}: streaming the shards from the object store at {_endpoint()}; chunks are "
                      f"cached in {cache} (set SPEEDKIT_SHARDS to cache them elsewhere)", stacklevel=4)


def describe(shards) -> str:
    """Where the loaders read ``shards``: the URL and its cache folder, or the folder."""
    return f"{shards.url} (cached in {shards.root})" if shards.url else str(shards.root)


# -- litdata's downloads from a plain-http endpoint ----------------------------------------------------------
_DOWNLOADER = None


def allow_http_endpoints() -> None:
    """Let litdata's chunk downloads reach an S3-compatible endpoint on plain http (a MinIO on the local network,
    a test server): litdata fetches chunks with obstore, which refuses ``http://`` unless its ``allow_http``
    client option is set, and litdata does not set it from the endpoint (AWS_ALLOW_HTTP is not read either). The
    ``s3://`` downloader is replaced by one that rebuilds litdata's obstore store with ``allow_http`` when the
    endpoint is http, and otherwise is litdata's own. Idempotent; also run in worker processes (see loaders)."""
    global _DOWNLOADER
    if _DOWNLOADER is not None:
        return
    from litdata.streaming import downloader as D

    class S3Downloader(D.S3Downloader):
        def _get_store(self, bucket: str):
            endpoint = str(self._client.client.meta.endpoint_url or "")
            if not endpoint.lower().startswith("http://"):
                return super()._get_store(bucket)

            def plain_http_store():
                from obstore.store import S3Store

                store = D._build_obstore_s3_store(bucket, self._client)
                return S3Store(config=store.config,  # the bucket is in its config retry_config=store.retry_config,
                               client_options={**(store.client_options or {}), "allow_http": True},
                               credential_provider=store.credential_provider)

            return D._cached_obstore_store(self, plain_http_store)

    # pickled by reference (a spawned worker unpickling it finds it through the module's __getattr__)
    S3Downloader.__module__, S3Downloader.__qualname__ = __name__, "_S3Downloader"
    D.register_downloader("s3://", S3Downloader, overwrite=True)
    _DOWNLOADER = S3Downloader


def __getattr__(name: str):
    if name == "_S3Downloader":
        allow_http_endpoints()
        return _DOWNLOADER
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def verify_remote(shards) -> list[str]:
    """:func:`speedkit.data.streaming.shards.verify_contents` on the store's objects: each chunk's SHA-256 (read
    from the store, not cached) against the one its part's ``.done`` marker recorded; the objects that differ."""
    bucket, prefix = split_url(shards.url)
    client = _client()
    problems = []
    try:
        sizes = _list(client, bucket, prefix)
        for split in shards.manifest["splits"]:
            for marker in sorted(n for n in sizes if n.startswith(f"{split}/") and n.endswith(".done")):
                recorded = json.loads(_get(client, bucket, prefix, marker)).get("sha256", {})
                for name, expected in recorded.items():
                    if f"{split}/{name}" not in sizes:
                        problems.append(f"{shards.url}/{split}/{name} is missing")
                        continue
                    digest = hashlib.sha256()
                    key = f"{prefix}/{split}/{name}" if prefix else f"{split}/{name}"
                    for block in client.get_object(Bucket=bucket, Key=key)["Body"].iter_chunks(1 << 20):
                        digest.update(block)
                    if digest.hexdigest() != expected:
                        problems.append(f"{shards.url}/{split}/{name} was altered since it was written (its SHA-256 "
                                        f"differs)")
    except Exception as e:
        raise _explain(shards.url, e) from None
    return problems
