"""A Hugging Face causal LM (transformers, built from a config: nothing downloaded) trains through the Trainer
on dict batches from the text-folder task, and every language method either acts on it or says why not."""
from __future__ import annotations

import shutil

import pytest
from prerequisites import import_or_missing

from speedkit.core import Event
from speedkit.data.text import DEFAULT_TEXT_ROOT
from speedkit.methods import REGISTRY
from speedkit.tasks import make_trainer

pytestmark = pytest.mark.prerequisite("python-docs")

LANGUAGE_SURGERY = sorted(name for name, cls in REGISTRY.items()
                          if cls.CARD.domain == "language" and Event.INIT in cls.CARD.events)


@pytest.fixture(autouse=True)
def needs_transformers():
    """Skipped where transformers is not installed (failed under CI=true, whose dev install has it)."""
    import_or_missing("transformers", "pip install 'torch-speedkit[hf]'")



@pytest.fixture(scope="module")
def text_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("text")
    for path in sorted((DEFAULT_TEXT_ROOT / "tutorial").glob("*.rst.txt"))[:12]:
        shutil.copy(path, root / path.name)
    return root


def hf_trainer(text_dir, tmp_path, **kwargs):
    return make_trainer("text-folder", "baseline", data=text_dir, model="hf:gpt2-nano", batch_size=8,
                        eval_fraction=0.02, run_dir=tmp_path, save_checkpoints=False, **kwargs)


def test_a_hugging_face_causal_lm_trains_on_dict_batches(text_dir, tmp_path):
    trainer = hf_trainer(text_dir, tmp_path, duration="12ba", eval_interval="6ba")
    batch = next(iter(trainer.state.train_dataloader))
    assert set(batch) == {"input_ids", "labels"} and batch["input_ids"].shape == (8, 256)
    assert type(trainer.state.model.model).__name__ == "GPT2LMHeadModel"
    record = trainer.fit()
    assert record.status == "completed"
    assert trainer.state.timestamp.token == 12 * 8 * 256  # tokens counted from the dict's input_ids
    first, last = record.evals[0]["eval/bpb"], record.evals[-1]["eval/bpb"]
    assert last < first < 8.5  # bits per byte fall: it learns next bytes, logits compared with shifted labels


@pytest.mark.parametrize("method", LANGUAGE_SURGERY)
def test_each_language_method_acts_on_the_hugging_face_model_or_says_why(text_dir, tmp_path, method):
    try:
        trainer = hf_trainer(text_dir, tmp_path, duration="1ba", methods={method: {}})
    except ValueError as refusal:
        assert str(refusal).startswith(f"{method} found no ") and "remove the method" in str(refusal)
        return
    assert any(note.startswith(method) for note in trainer.record.notes.get("surgery", []))  # what it changed
    assert trainer.fit().status == "completed"


def test_every_language_surgery_acts_on_hugging_face_gpt2():
    """GPT2Attention (through transformers' attention registry) and Conv1D MLPs are found by structure."""
    from speedkit.hosts import LOOP, MethodSession
    from speedkit.methods import build_methods
    from speedkit.models import get_model

    for name in LANGUAGE_SURGERY:
        session = MethodSession(LOOP, build_methods({name: {}}), max_duration="1ba")
        session.init(get_model("hf:gpt2-nano"))  # INIT: the surgery, reported into the session's record
        (note,) = session.record.notes["surgery"]
        assert note.startswith(f"{name}: changed 5 "), note  # every one of gpt2-nano's 5 blocks


def test_hot_runs_on_hf_gpt2(text_dir, tmp_path):
    trainer = make_trainer("text-folder", "hot", data=text_dir, model="hf:gpt2-nano", batch_size=8, eval_fraction=0.02,
                           run_dir=tmp_path, save_checkpoints=False, duration="2ba", eval_interval="2ba")
    record = trainer.fit()
    assert record.status == "completed"
    changed = {note.split(":")[0] for note in record.notes["surgery"]}
    assert changed == {"rotary_embeddings", "qk_norm", "relu_squared", "muon"}
    assert trainer.engine.events_of("seq_length_warmup")[Event.AFTER_DATALOADER] == 2


def test_a_llama_style_model_loads_from_a_local_folder_and_takes_the_language_surgeries(tmp_path):
    """from_pretrained from a folder (nothing downloaded); LLaMA's own rotary and gated MLPs are said, not doubled."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from speedkit.core.method import NothingToChangeError
    from speedkit.methods.alibi import apply_alibi
    from speedkit.methods.gated_linear_units import apply_gated_linear_units
    from speedkit.methods.qk_norm import apply_qk_norm
    from speedkit.methods.relu_squared import apply_relu_squared
    from speedkit.methods.rotary_embeddings import apply_rotary_embeddings
    from speedkit.models import get_model

    config = LlamaConfig(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(tmp_path / "llama")
    model = get_model(f"hf:{tmp_path / 'llama'}")
    assert type(model.model).__name__ == "LlamaForCausalLM"
    x = torch.randint(0, 256, (2, 16))
    before = model(x).logits
    assert str(apply_qk_norm(model)) == "qk_norm: changed 2 attention modules"
    assert str(apply_alibi(model)) == "alibi: changed 2 attention modules"
    assert str(apply_relu_squared(model)) == "relu_squared: changed 2 MLP activations"  # act_fn of the gate
    assert not torch.allclose(model(x).logits, before)  # the surgeries reach LLaMA's attention and MLPs
    with pytest.raises(NothingToChangeError, match="rotates already"):
        apply_rotary_embeddings(model)
    with pytest.raises(NothingToChangeError, match="gated already"):
        apply_gated_linear_units(model)
    with pytest.raises(ValueError, match="neither a preset .* nor a local folder"):
        get_model(f"hf:{tmp_path / 'missing'}")


def test_eager_hugging_face_attention_is_routed_through_sdpa_and_the_report_says_so():
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from speedkit.methods.qk_norm import apply_qk_norm

    config = GPT2Config(vocab_size=256, n_positions=32, n_embd=32, n_layer=1, n_head=2, bos_token_id=None,
                        eos_token_id=None, attn_implementation="eager")
    model = GPT2LMHeadModel(config)
    x = torch.randint(0, 256, (2, 8))
    before = model(input_ids=x).logits
    report = apply_qk_norm(model)
    assert model.config._attn_implementation == "sdpa"
    assert any("'eager' -> 'sdpa'" in detail for detail in report.details)
    assert not torch.allclose(model(input_ids=x).logits, before)  # the transform runs: eager never calls SDPA
