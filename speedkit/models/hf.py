"""Hugging Face causal language models: built from a config (random weights), or loaded from a local folder.

``get_model("hf:gpt2-nano")`` is a ``transformers`` GPT-2 with the sizes of speedkit's ``gpt-nano`` preset
(``hf:gpt2-micro``, ``hf:gpt2-mini``, ``hf:gpt2-small`` likewise) over the 256 byte values.
``get_model("hf:/path/to/folder")`` loads ``AutoModelForCausalLM.from_pretrained`` from a folder written by
``save_pretrained`` (any causal LM: GPT-2, LLaMA, ...), from that folder only: nothing is downloaded.
Either is called Hugging Face style, ``model(**batch)`` with ``input_ids`` and ``labels``, and trains on the
dict batches the language tasks yield for it. Needs ``pip install 'torch-speedkit[hf]'``.
"""
from __future__ import annotations

import torch.nn as nn

from pathlib import Path

from .gpt import GPT_CONFIGS
from .pretrained import saved_surgeries

HF = "hf:"  # every Hugging Face model's name starts so
PREFIX = "hf:gpt2-"  # hf:gpt2-nano -> the gpt-nano preset's sizes
GPT2 = "hf:gpt2"  # GPT-2 124M's sizes (speedkit's gpt2-124m preset), built from a config


class NextTokenLM(nn.Module):
    """A Hugging Face causal LM for batches whose ``labels`` are already the next tokens.

    speedkit's text loaders shift the targets by one; a Hugging Face model given ``labels`` shifts them
    again, so it is asked for logits only and the Trainer's cross-entropy compares them with the labels.
    """

    takes_dict_batches = True  # the language tasks yield {"input_ids", "labels"} for it

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        self.config = model.config

    def forward(self, input_ids, labels=None, attention_mask=None):
        return self.model(input_ids=input_ids, attention_mask=attention_mask)


def _transformers(name: str):
    try:
        import transformers
    except ImportError:
        raise ValueError(f"model {name!r} needs transformers, which is not installed; pip install 'torch-speedkit[hf]' "
                         f"or pick a gpt-* model") from None
    return transformers


def hf_causal_lm(name: str, vocab_size: int | None = None) -> NextTokenLM:
    """``hf:gpt2-<preset>``: a transformers GPT-2 with the sizes of speedkit's ``gpt-<preset>``;
    ``hf:gpt2``: GPT-2 124M's sizes (12 layers, 12 heads, 768 wide, 1024 positions), from a config, nothing
    downloaded; ``vocab_size`` overrides the preset's (a task's BPE shards); ``hf:<folder>``: the causal LM a
    ``save_pretrained`` wrote into that local folder."""
    if name == GPT2:
        return _gpt2_preset(name, "gpt2-124m", vocab_size)
    preset = "gpt-" + name.removeprefix(PREFIX)
    if name.startswith(PREFIX) and preset in GPT_CONFIGS:
        return _gpt2_preset(name, preset, vocab_size)
    folder = Path(name.removeprefix(HF)).expanduser()
    if name.startswith(HF) and folder.is_dir():
        return _from_folder(name, folder)
    known = [GPT2, *(PREFIX + n.removeprefix("gpt-") for n in GPT_CONFIGS if n.startswith("gpt-"))]
    raise ValueError(f"unknown Hugging Face model {name!r}: neither a preset ({', '.join(known)}) nor a local folder "
                     f"written by save_pretrained (nothing is downloaded; save the model there first)")


def _from_folder(name: str, folder: Path) -> NextTokenLM:
    if not (folder / "config.json").is_file():
        raise ValueError(f"{name!r}: {folder} has no config.json; write the model there with "
                         f"model.save_pretrained({str(folder)!r})")
    record = saved_surgeries(folder)
    if record is not None:  # a plain from_pretrained would refuse it (speedkit/models/pretrained.py)
        names = ", ".join(s["name"] for s in record[0])
        raise ValueError(f"{name!r}: {folder} holds a model that speedkit's surgeries changed ({names}), which "
                         f"hf:<folder> cannot rebuild; load it in Python with speedkit.hosts.hf.load_pretrained("
                         f"{str(folder)!r})")
    transformers = _transformers(name)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, local_files_only=True)
    return NextTokenLM(model)


def _gpt2_preset(name: str, preset: str, vocab_size: int | None = None) -> NextTokenLM:
    transformers = _transformers(name)
    GPT2Config, GPT2LMHeadModel = transformers.GPT2Config, transformers.GPT2LMHeadModel
    sizes = GPT_CONFIGS[preset]
    config = GPT2Config(vocab_size=vocab_size or sizes.vocab_size, n_positions=sizes.block_size, n_embd=sizes.n_embd,
                        n_layer=sizes.n_layer, n_head=sizes.n_head, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                        bos_token_id=None, eos_token_id=None)  # bytes have no special tokens
    return NextTokenLM(GPT2LMHeadModel(config))
