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
