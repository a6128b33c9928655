"""Issue 41.4: a model surgered in a SpeedkitTrainer, saved with save_model / save_pretrained, comes back as
trained through speedkit.hosts.hf.load_pretrained; plain from_pretrained loses the surgeries (the reason the
loader exists)."""
from __future__ import annotations

import pytest
import torch
from prerequisites import import_or_missing

transformers = import_or_missing("transformers", "pip install 'torch-speedkit[hf]'")

from speedkit.hosts.hf import SURGERY_FILE, SpeedkitTrainer, load_pretrained  # noqa: E402
from speedkit.methods import QKNorm, ReLUSquared, RotaryEmbeddings  # noqa: E402
from speedkit.models import get_model  # noqa: E402


class Tokens(torch.utils.data.Dataset):
    def __init__(self):
        self.rows = torch.randint(0, 256, (32, 32), generator=torch.Generator().manual_seed(0))

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return {"input_ids": self.rows[i], "labels": self.rows[i]}


def test_a_surgered_model_saved_by_the_trainer_reloads_as_trained(tmp_path):
    torch.manual_seed(0)
    model = get_model("hf:gpt2-nano").model
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=3, per_device_train_batch_size=8,
                                          learning_rate=3e-3, lr_scheduler_type="constant", report_to=[],
                                          use_cpu=True, disable_tqdm=True, save_strategy="no")
    trainer = SpeedkitTrainer(model=model, args=args, train_dataset=Tokens(),
                              methods=[QKNorm(), RotaryEmbeddings(remove_position_embeddings=True),
                                       ReLUSquared()])
    trainer.train()
    trainer.save_model(str(tmp_path / "saved"))
    assert (tmp_path / "saved" / SURGERY_FILE).is_file()

    ids = Tokens()[0]["input_ids"][None]
    model.eval()
    with torch.no_grad():
        trained = model(input_ids=ids, labels=ids).loss
        reloaded = load_pretrained(tmp_path / "saved").eval()
        assert reloaded(input_ids=ids, labels=ids).loss == pytest.approx(trained.item(), abs=1e-6)
        assert any(name.endswith("qk_norm.q_gain") for name, _ in reloaded.named_parameters())
        plain = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "saved").eval()
        assert abs(plain(input_ids=ids, labels=ids).loss.item() - trained.item()) > 1e-3  # what the loader fixes

    reloaded.save_pretrained(tmp_path / "again")  # a reloaded model saves its surgeries too
    assert (tmp_path / "again" / SURGERY_FILE).is_file()
    (tmp_path / "again" / SURGERY_FILE).write_text('{"surgeries": [{"name": "relu_squared", "params": {}}]}')
    with pytest.raises(ValueError, match=r"does not fit .* after the surgeries \['relu_squared'\]: saved tensors "
                                         r"that fit nowhere \[.*qk_norm"):
        load_pretrained(tmp_path / "again")  # QK-norm's gains, saved, fit nowhere without its surgery
