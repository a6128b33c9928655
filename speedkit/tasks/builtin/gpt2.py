"""The gpt2 task: a GPT-2 124M on BPE token shards (``--task gpt2 --data DIR``).

``DIR`` is a shard folder of BPE tokens (``speedkit data prepare``, with GPT-2's ``tokenizer.json`` or a BPE
trained on the corpus) or a text folder, tokenized into shards once (a BPE trained on it, as ``text-folder
--stream`` does). The models: speedkit's GPT at GPT-2 124M's sizes (``gpt2-124m``: 12 layers, 12 heads, 768 wide,
1024 tokens of context) and a transformers GPT-2 of the same sizes built from a config (``hf:gpt2``, nothing
downloaded), both with the shards' vocabulary. Its presets (``presets/gpt2.yaml``): an AdamW baseline, Composer's
GPT-2 recipe (ALiBi and sequence-length warmup) and a modded-nanogpt-style ``hot`` (Muon, rotary, QK-norm, ReLU²).

Two sizes (``sizes=``, ``speedkit.tasks.builtin._seed``): ``gpu``, the seed's real ones (windows of 1024 tokens);
``cpu``, a rehearsal: the same methods on ``gpt-nano`` (5 layers, 128 wide) over windows of 256 tokens.
"""
from __future__ import annotations

from speedkit.tasks.builtin import _seed
from speedkit.tasks.builtin._seed import SeedSizes
from speedkit.tasks.task import Task

HOW = ("--data is a folder of BPE token shards or a text folder (.txt, .md, .rst): `speedkit data prepare DIR "
       "--out SHARDS --kind text` writes the shards once (--tokenizer tokenizer.json for GPT-2's own BPE)")
# Evaluation reads at most this many tokens per evaluation, whatever the window.
EVAL_TOKENS = 64 * 1024

SIZES = {
    # modded-nanogpt's target: 3.28 validation loss on FineWeb with GPT-2's tokenizer
    "gpu": SeedSizes(model="gpt2-124m", context=1024, target=3.28),
    # a rehearsal: gpt-nano over 256-token windows, batch 16, a twentieth of each budget; the learning rates
    # stay the published ones (AdamW's does not follow the linear rule, and a narrow model takes at least GPT-2
    # 124M's rate); its target is the user's corpus's. The presets' cadences (500 and 250 batches) are longer
    # than the scaled budgets (700 and 160), so a rehearsal would meet its target only at its last batch: it
    # evaluates every 25 batches instead. hot's scaled budget (160 batches, 0.23 of the baseline's) ended short of
    # a target the baseline holds; its 240 was chosen on pydocs' text and measured on another corpus
    # (bench/results/2026-12-04-gpt2-rehearsal-debdocs/README.md, "The gpt2 rehearsal's hot budget").
    "cpu": SeedSizes(model="gpt-nano", context=256, target=4.0, batch_size=16, duration_scale=0.05,
                     eval_interval="25ba", durations={"hot": "240ba"}),
}
MODELS = ("gpt2-124m", "hf:gpt2", "gpt-nano", "gpt-micro", "gpt-mini", "gpt-small")


def gpt2_recipes(sizes: str) -> dict:
    """The presets (``presets/gpt2.yaml``) at ``sizes`` (``cpu``, ``gpu``)."""
    return _seed.sized_recipes("gpt2", SIZES[sizes], scale_lr=False)


def gpt2_task(data=None, sizes: str | None = None, target: float | None = None, skip_unreadable: bool = False,
              stream: bool | None = None) -> Task:
    """A GPT-2 124M on BPE token shards, with an AdamW baseline, Composer's and a modded-nanogpt-style recipe
    (``--task gpt2``).

    ``sizes``: ``gpu`` (GPT-2 124M, 1024-token windows) or ``cpu`` (a rehearsal: gpt-nano, 256-token windows);
    None: ``gpu`` where CUDA is available. ``target`` is the validation loss (nats per token) to reach.
    The task always streams: ``stream`` True or None, for the folder tasks' flags; False is refused."""
    _seed.refuse_in_memory("gpt2", stream)
    sizes = _seed.pick_sizes("gpt2", sizes)
    folder = _seed.need_data("gpt2", data, HOW)
    spec = SIZES[sizes]
    from speedkit.models import get_model
    from speedkit.tasks.builtin import _streamed

    # a text folder is tokenized into blocks of the sizes' context: windows never cross a block
    shards = _streamed.shards_for(folder, "tokens", "a text folder", skip_bad=skip_unreadable, block=spec.context)
    info = _streamed.read_kind(shards, "tokens", "task gpt2: {shards} holds {kind} shards, not BPE tokens; " + HOW)

    def model(name: str, vocab: int):
        if name.startswith("hf:"):
            return get_model(name, vocab_size=vocab)
        return get_model(name, vocab_size=vocab, block_size=max(spec.context, 8))

    return _streamed.streamed_token_task(
        shards, info, name="gpt2", longest_context=spec.context, eval_tokens=EVAL_TOKENS, model=model,
        target=spec.target if target is None else target,
        summary=lambda info, vocab: f"gpt2 ({sizes} sizes): {info.manifest.get('tokens', {}).get('train', '?')} "
                                    f"BPE tokens (vocabulary {vocab}) streamed from shards {_streamed.describe(info)}, "
                                    f"windows of up to {spec.context} tokens",
        recipes=gpt2_recipes(sizes), models=(spec.model, *[m for m in MODELS if m != spec.model]))


gpt2_task.data_hint = HOW
