"""The pydocs task: a byte-level language model on the Python documentation sources (``python3.11-doc``),
3.30 validation bits per byte to reach (what the hand-written baseline reaches at about batch 470 of its 600,
the language benchmark's target)."""
from __future__ import annotations

from speedkit.tasks.builtin._shared import GPT_MODELS, language_metrics, language_model, text_data
from speedkit.tasks.recipes import load_presets
from speedkit.tasks.task import Task

_pydocs_train, _pydocs_eval = text_data(None)
PYDOCS = Task(
    name="pydocs", domain="language", summary="byte-level language model on the Python documentation sources",
    model=language_model, train_data=_pydocs_train, eval_data=_pydocs_eval, metrics=language_metrics,
    target_metric="eval/bpb", target_value=3.30, recipes=load_presets("pydocs"), baselines=("baseline", "tuned"),
    models=GPT_MODELS)
