"""A Hugging Face model that speedkit's surgeries changed, saved so that it cannot be reloaded without them.

``from_pretrained`` builds the architecture from ``config.json``, which knows nothing of speedkit's surgeries:
QK-norm's gains would be dropped as unexpected keys and rotary positions or ReLU² lost, with at most a warning.
So speedkit's Trainer and every host mark the models their surgeries changed (any submodule with
``save_pretrained``): each save (``save_pretrained``, the Hugging Face Trainer's ``save_model`` and
``checkpoint-N`` folders) records in ``config.json``

* ``"speedkit": {"surgeries": [...], "attn_implementation": ...}``: the surgeries with their parameters, and the
  attention implementation the model was built with;
* ``"attn_implementation": "speedkit.hosts.hf.load_pretrained"``: a name transformers does not know, so a plain
  ``from_pretrained`` (``GPT2LMHeadModel``'s, ``AutoModelForCausalLM``'s) refuses the folder with a message that
  names the loader, instead of building the unchanged architecture and training on wrong numbers.

``speedkit.hosts.hf.load_pretrained(folder)`` reads the record, builds the model, runs the same surgeries and
loads every saved tensor. This module imports neither transformers nor anything above ``speedkit.core``, so
the Trainer and every host can mark their model.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path

from speedkit.core import Event

LOG = logging.getLogger("speedkit")

CONFIG_KEY = "speedkit"  # config.json's record of the surgeries
RELOAD_WITH = "speedkit.hosts.hf.load_pretrained"  # config.json's attn_implementation: plain from_pretrained refuses
EARLIER_SURGERY_FILE = "speedkit_surgery.json"  # where saves before the config.json record kept the surgeries


def surgeries_of(methods) -> list[dict]:
    """The model surgeries (methods that act at INIT) among ``methods``, as data: name and parameters."""
    return [{"name": m.name, "params": dict(m.params)} for m in methods if Event.INIT in m.CARD.events]


def mark_surgered(model, methods) -> None:
    """Make ``save_pretrained`` of ``model`` and of every submodule that has one record ``methods``' surgeries
    in the saved ``config.json`` (see this module's docstring). Nothing to record, nothing changes."""
    surgeries = surgeries_of(methods)
    if not surgeries:
        return
    for module in model.modules():
        if callable(getattr(module, "save_pretrained", None)) and getattr(module, "config", None) is not None:
            _record_on_save(module, surgeries)


def _record_on_save(module, surgeries: list[dict]) -> None:
    original = module.save_pretrained
    if getattr(original, "_speedkit_surgeries", None) is not None:
        return
    built_with = getattr(module.config, "_attn_implementation", None)

    def save_pretrained(save_directory, *args, **kwargs):
        result = original(save_directory, *args, **kwargs)
        config_file = Path(save_directory, "config.json")
        if config_file.is_file():  # not on the ranks that do not write
            config = json.loads(config_file.read_text())
            config[CONFIG_KEY] = {"surgeries": surgeries, "attn_implementation": built_with}
            config["attn_implementation"] = RELOAD_WITH
            config_file.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
            LOG.info("saved %s with speedkit's surgeries (%s): reload it with %s(path); a plain from_pretrained "
                     "refuses it", save_directory, ", ".join(s["name"] for s in surgeries), RELOAD_WITH)
        return result

    save_pretrained._speedkit_surgeries = surgeries
    object.__setattr__(module, "save_pretrained", save_pretrained)


def saved_surgeries(folder) -> tuple[list[dict], str | None] | None:
    """The surgeries recorded in ``folder``'s config.json and the attention implementation the model was built
    with, or None for a folder speedkit did not change. A folder saved by speedkit 0.x before this record kept
    its surgeries in ``speedkit_surgery.json`` beside the weights; it is read too, so it reloads as trained."""
    config_file = Path(folder, "config.json")
    record = json.loads(config_file.read_text()).get(CONFIG_KEY) if config_file.is_file() else None
    if record:
        return list(record["surgeries"]), record.get("attn_implementation")
    earlier = Path(folder, EARLIER_SURGERY_FILE)
    if earlier.is_file():
        return list(json.loads(earlier.read_text())["surgeries"]), None
    return None
