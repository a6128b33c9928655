"""What the built-in tasks share: their model factories and metrics, the recipe's augmentation, and the
byte-level text data that both ``pydocs`` and ``text-folder`` read."""
from __future__ import annotations

import functools

import torch

from speedkit.data import Augment, TokenBatchLoader, load_text_corpus
from speedkit.models import get_model
from speedkit.record.metrics import Accuracy, BitsPerByte, CrossEntropy
from speedkit.tasks.recipes import Recipe
from speedkit.tasks.task import DataRequest

LIBRARY_MODELS = ("torchvision:*", "timm:*")  # any classifier of these, adapted to channels and classes
GPT_MODELS = ("gpt-nano", "gpt-micro", "gpt-mini", "gpt-small",
              "hf:gpt2-nano", "hf:gpt2-micro", "hf:gpt2-mini", "hf:gpt2-small",  # hf: transformers, from a config
              "hf:*")  # hf:<folder>: from_pretrained from a local folder


def classification_metrics() -> dict:
    return {"accuracy": Accuracy(), "loss": CrossEntropy()}


def language_metrics() -> dict:
    return {"bpb": BitsPerByte(), "loss": CrossEntropy()}


def vision_model_factory(in_channels: int, num_classes: int):
    """``model(name)`` for a vision task: speedkit's models and ``torchvision:``/``timm:`` ones, all
    built for ``in_channels`` and ``num_classes``."""
    def model(name: str) -> torch.nn.Module:
        return get_model(name, num_classes=num_classes, in_channels=in_channels)
    return model


def language_model(name: str) -> torch.nn.Module:
    return get_model(name)


def recipe_augment(recipe: Recipe | None) -> Augment | None:
    """The recipe's batch augmentation, or None when it has none."""
    return Augment(**recipe.augment) if recipe is not None and recipe.augment else None


# -- byte-level text: pydocs and text-folder ------------------------------------------------
@functools.lru_cache(maxsize=4)
def text_corpus(root: str | None, seed: int, skip_unreadable: bool = False):
    """The byte corpus under ``root`` (None: the Python docs), split by file with ``seed``; read once.
    Files that are not text are refused, or left out with ``skip_unreadable``."""
    return load_text_corpus(root, seed=seed, skip_unreadable=skip_unreadable)


def _context_length(request: DataRequest, longest: int = 256) -> int:
    """The request's model's context, at most ``longest`` (``longest`` where the model states none)."""
    config = getattr(request.model, "config", None)
    for field in ("block_size", "n_positions", "max_position_embeddings"):  # speedkit's GPT, Hugging Face's
        if getattr(config, field, None):
            return min(int(getattr(config, field)), longest)
    return longest


class DictBatches:
    """A token loader whose ``(inputs, targets)`` batches come out as ``{"input_ids", "labels"}`` dicts, for
    models called Hugging Face style; length, epochs and resuming part-way are the wrapped loader's."""

    def __init__(self, loader):
        self.loader = loader

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):
        return self._as_dicts(iter(self.loader))

    def iter_from(self, batch_index: int):
        return self._as_dicts(self.loader.iter_from(batch_index))

    def __getattr__(self, name):  # batch_size, tokens_per_batch, set_epoch, ...
        return getattr(self.__dict__["loader"], name)

    @staticmethod
    def _as_dicts(batches):
        for inputs, targets in batches:
            yield {"input_ids": inputs, "labels": targets}


def _for_model(loader, request: DataRequest):
    return DictBatches(loader) if getattr(request.model, "takes_dict_batches", False) else loader


def _enough_text(root, part: str, tokens: int, seq_len: int) -> None:
    """Refuse a folder whose text is shorter than one training sequence, naming it and the fix."""
    if tokens < seq_len + 1:
        raise ValueError(f"text-folder {root}: its {part} files hold {tokens} bytes of text, fewer than one "
                         f"sequence of the model's context ({seq_len} + 1 bytes); add text (the files may be "
                         f"empty), or give a model with a shorter context (--model)")


def text_data(root: str | None, skip_unreadable: bool = False, split_seed: int | None = None):
    """(train_data, eval_data) over the text files under ``root`` (None: the Python docs), split by file with
    ``split_seed`` (None: each run's seed)."""
    def corpus_of(request: DataRequest):
        return text_corpus(root, request.seed if split_seed is None else split_seed, skip_unreadable)

    def train(request: DataRequest):
        corpus, seq_len = corpus_of(request), _context_length(request)
        tokens = corpus.train[: max(seq_len + 1, int(len(corpus.train) * request.data_fraction))]
        _enough_text(root, "training", len(tokens), seq_len)
        loader = TokenBatchLoader(tokens, seq_len, request.batch_size, seed=request.seed, device=request.device)
        return _for_model(loader, request)

    def evaluate(request: DataRequest):
        corpus, seq_len = corpus_of(request), _context_length(request)
        batches = max(1, int(64 * (request.eval_fraction or 1.0)))
        _enough_text(root, "validation", len(corpus.val), seq_len)
        loader = TokenBatchLoader(corpus.val, seq_len, 32, steps_per_epoch=batches, shuffle=False,
                                  device=request.device)
        return _for_model(loader, request)

    return train, evaluate
