"""The text-folder task: a byte-level GPT on the user's own text files (``--task text-folder --data DIR``)."""
from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path

from speedkit.tasks.builtin._shared import GPT_MODELS, language_metrics, language_model, text_corpus, text_data
from speedkit.tasks.builtin.pydocs import PYDOCS
from speedkit.tasks.task import Task

# A folder's files are split train/validation with this seed, whatever the run's, as `speedkit data prepare` splits
# them (its --seed's default): one validation set for every run, in memory or streamed.
SPLIT_SEED = 0


def _adopted(recipes: dict, names: tuple[str, ...]) -> dict:
    """Recipes of a built-in task for a folder task: the same methods and settings, nothing they reached,
    and the folder task's own target (what a recipe reached on one data set says nothing of another). The
    Task adds the language ladder rebuilt on them (``speedkit.tasks.ladder``)."""
    return {name: dataclasses.replace(recipes[name], task=None, domain=None, target=None, reached=None) for name in names}


def text_folder_task(data, target: float | None = None, skip_unreadable: bool = False,
                     stream: bool | None = None) -> Task:
    """A byte-level GPT on the text files (.txt, .rst, .md) under DIR, split train/validation by file.

    ``target`` is the validation bits per byte to reach (default 2.5). A file that is not text is refused
    naming it, or left out and counted with ``skip_unreadable=True``.

    When ``data`` is a shard folder of BPE tokens (``speedkit data prepare``), or with ``stream=True`` (the
    folder is then tokenized into shards once, with a BPE trained on it), a GPT with the shards' vocabulary
    trains on windows streamed from them, and ``target`` is the validation loss (default 4.0 nats per token)."""
    from speedkit.tasks.builtin import _streamed

    if _streamed.streams("text-folder", data, stream):
        shards = _streamed.shards_for(data, "tokens", "streaming asked for", skip_bad=skip_unreadable)
        return _streamed.folder_token_task(shards, target, _adopted(PYDOCS.recipes, ("baseline",)))
    target = 2.5 if target is None else target
    root = Path(data).expanduser()
    try:
        corpus = text_corpus(str(root), SPLIT_SEED, skip_unreadable)  # fails now, before a model is built, if the
    except (FileNotFoundError, ValueError) as e:             # folder holds too little text, or files that are not
        raise type(e)(f"text-folder {root}: {e}") from None
    if corpus.skipped:
        warnings.warn(f"text-folder {root}: left out {len(corpus.skipped)} file(s) that are not text: "
                      + ", ".join(str(f) for f in corpus.skipped[:5]) + (" ..." if len(corpus.skipped) > 5 else ""),
                      stacklevel=2)
    train, evaluate = text_data(str(root), skip_unreadable, split_seed=SPLIT_SEED)
    return Task(name="text-folder", domain="language", summary=f"byte-level language model on the text in {root}",
                model=language_model, train_data=train, eval_data=evaluate, metrics=language_metrics,
                target_metric="eval/bpb", target_value=target, models=GPT_MODELS,
                recipes=_adopted(PYDOCS.recipes, ("baseline",)))
