"""``speedkit data``: data larger than memory, prepared once as shards that the loaders stream.

``speedkit data prepare SOURCE --out DIR`` writes litdata shards of an image folder (class folders, or train/ and
val/) or a text folder (see :mod:`speedkit.data.streaming.prepare`); ``speedkit data info DIR`` says what a shard
folder holds and checks it against its index. Train on the shards with ``--task image-folder --data DIR`` or
``--task text-folder --data DIR``, or with the seed's workloads, ``--task imagenet`` or ``--task gpt2``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys


def add_parser(commands) -> None:
    data = commands.add_parser("data", allow_abbrev=False, help="prepare data larger than memory as shards to stream",
                               description=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    actions = data.add_subparsers(dest="action", required=True, metavar="ACTION")
    prepare = actions.add_parser(
        "prepare", allow_abbrev=False, formatter_class=argparse.RawDescriptionHelpFormatter,
        help="write shards of an image folder or a text folder (resumable: rerun to continue)",
        description="Images: each resized to --short-side (larger ones only) and stored as JPEG bytes with its label "
                    "and a stable id. Text: split train/val by file, BPE-tokenized (--tokenizer, else a byte-level "
                    "BPE trained on the corpus and saved beside the shards), stored as token blocks. A killed prepare "
                    "continues where it stopped when run again with the same arguments.",
        epilog="examples:\n  speedkit data prepare ~/imagenet --out ~/imagenet-shards --short-side 160 --workers 8\n"
               "  speedkit data prepare ~/corpus --out ~/corpus-shards --tokenizer ~/gpt2/tokenizer.json")
    prepare.add_argument("source", help="an image folder (<class>/*.jpg, or train/<class>/ and val/<class>/) or a "
                                        "folder of text files (.txt, .rst, .md)")
    prepare.add_argument("--out", required=True, help="the shard folder to write (new or empty, or the same one "
                                                      "again to continue a prepare that stopped)")
    prepare.add_argument("--kind", choices=["images", "text"], help="what SOURCE holds (default: images when it "
                                                                    "holds image files, else text)")
    prepare.add_argument("--short-side", type=int, default=160,
                         help="images: resize so the short side is this many pixels (default 160; 256 keeps more "
                              "for testing at higher resolution)")
    prepare.add_argument("--quality", type=int, default=90, help="images: JPEG quality (default 90)")
    prepare.add_argument("--tokenizer", help="text: a tokenizer.json (Hugging Face tokenizers, e.g. GPT-2's from a "
                                             "local model folder); default: train a byte-level BPE on the corpus")
    prepare.add_argument("--vocab-size", type=int, default=8192,
                         help="text: the vocabulary of the BPE trained when no --tokenizer is given (default 8192)")
    prepare.add_argument("--block", type=int, default=1024,
                         help="text: tokens per stored block; training windows (seq_len) must divide it (default 1024)")
    prepare.add_argument("--keep-order", action="store_true",
                         help="text: store the blocks in the text's order (default: shuffled, so that a streamed "
                              "run's early batches sample the whole corpus, not a few documents)")
    prepare.add_argument("--val-fraction", type=float, default=0.1,
                         help="the share held out for validation (whole files for text) when SOURCE has no train/ and val/ "
                              "split of its own (default 0.1)")
    prepare.add_argument("--seed", type=int, default=0, help="the seed of the split and the write order (default 0)")
    prepare.add_argument("--workers", type=int, default=min(8, os.cpu_count() or 1),
                         help="processes that decode and write (default: up to 8); 0 writes in this process")
    prepare.add_argument("--skip-bad", action="store_true",
                         help="leave out (and count) images that cannot be decoded and files that are not text, "
                              "instead of stopping to name them")
    prepare.add_argument("--verify", action="store_true",
                         help="check the chunks of the parts already written by their SHA-256 too (reads every byte) "
                              "and write again those that differ; without it, a rerun writes again the chunks that "
                              "are missing or cut short")
    prepare.add_argument("--overwrite", action="store_true",
                         help="start again when --out holds a prepare of other data (or of the source before it changed)")
    info = actions.add_parser("info", allow_abbrev=False, help="what a shard folder holds; checks it against its index")
    info.add_argument("folder", help="a shard folder written by `speedkit data prepare`")
    info.add_argument("--json", action="store_true", help="print the manifest as JSON")
    info.add_argument("--verify", action="store_true",
                      help="also check every chunk's SHA-256 against the one recorded when it was written (reads "
                           "every byte); exit status 1 when one differs")


def run(args) -> int:
    if args.action == "info":
        return _info(args)
    from speedkit.data.streaming.prepare import PrepareStopped, prepare

    options = dict(kind=args.kind,
                   short_side=args.short_side, quality=args.quality, tokenizer=args.tokenizer,
                   vocab_size=args.vocab_size, block=args.block, shuffle_blocks=not args.keep_order,
                   val_fraction=args.val_fraction, seed=args.seed,
                   workers=args.workers, skip_bad=args.skip_bad, overwrite=args.overwrite, verify=args.verify,
                   progress=sys.stderr.isatty())
    try:
        result = prepare(args.source, args.out, **options)
    except PrepareStopped as stopped:
        print(stopped.result.summary(), file=sys.stderr)
        return 1
    print(result.summary())
    if result.skipped:
        for path, why in result.skipped[:10]:
            print(f"  left out: {path} ({why})")
        if len(result.skipped) > 10:
            print(f"  ... and {len(result.skipped) - 10} more (listed in {result.out}/speedkit-shards.json)")
    task, seed_task = ("image-folder", "imagenet") if result.kind == "images" else ("text-folder", "gpt2")
    print(f"train on it: speedkit train --task {task} --data {result.out} (or --task {seed_task}, with the seed's "
          f"models and presets)")
    return 0


def _info(args) -> int:
    from speedkit.data.identity import shards_identity
    from speedkit.data.streaming.shards import read_shards

    shards = read_shards(args.folder)
    if args.json:
        print(json.dumps(shards.manifest, indent=1, sort_keys=True))
        return 0
    m = shards.manifest
    counts = ", ".join(f"{split} {info['samples']} in {info['chunks']} chunk(s)" for split, info in m["splits"].items())
    state = "complete" if shards.complete else f"PARTIAL ({m.get('stopped')})"
    fingerprint = shards_identity(shards.location, m, shards.fingerprint).get("fingerprint", "not recorded")
    print(f"{shards.location}: {m['kind']} shards, {state}: {counts}; data_fingerprint {fingerprint} (of the files "
          f"it was prepared from, as a run reports it), shards_fingerprint {shards.fingerprint}")
    if m["kind"] == "images":
        print(f"  {len(m['classes'])} classes, short side {m['options']['short_side']}, from {m['source']}")
    else:
        print(f"  vocabulary {m['vocab_size']} ({m['dtype']}), blocks of {m['block']} tokens, from {m['source']}")
    if m.get("skipped"):
        print(f"  {len(m['skipped'])} file(s) left out as unreadable")
    if args.verify:
        from speedkit.data.streaming.shards import repair_advice, verify_contents

        problems = verify_contents(shards)
        for problem in problems:
            print(f"  {problem}", file=sys.stderr)
        print(f"  verified: {'every chunk as written' if not problems else f'{len(problems)} chunk(s) differ'}")
        if problems:
            print(f"  {repair_advice(shards, verify=True)}", file=sys.stderr)
        return 1 if problems else 0
    return 0
