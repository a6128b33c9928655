"""Issue 41.4 and 55.2: a model speedkit's surgeries changed, saved with save_model / save_pretrained, comes back as
trained through speedkit.hosts.hf.load_pretrained, and transformers' own from_pretrained (GPT2LMHeadModel's,
AutoModelForCausalLM's) refuses the folder, naming that loader, instead of building the unchanged architecture."""
from __future__ import annotations

import json

import pytest
import torch
from prerequisites import import_or_missing

transformers = import_or_missing("transformers", "pip install 'torch-speedkit[hf]'")

from speedkit.hosts import Speedkit  # noqa: E402
from speedkit.hosts.hf import SpeedkitTrainer, load_pretrained  # noqa: E402
from speedkit.methods import QKNorm, ReLUSquared, RotaryEmbeddings  # noqa: E402
from speedkit.models import get_model  # noqa: E402

REFUSED = r"attn_implementation=\"speedkit\.hosts\.hf\.load_pretrained\""


class Tokens(torch.utils.data.Dataset):
    def __init__(self):
        self.rows = torch.randint(0, 256, (32, 32), generator=torch.Generator().manual_seed(0))

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return {"input_ids": self.rows[i], "labels": self.rows[i]}


def trained(tmp_path, methods):
    torch.manual_seed(0)
    model = get_model("hf:gpt2-nano").model
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=3, per_device_train_batch_size=8,
                                          learning_rate=3e-3, lr_scheduler_type="constant", report_to=[],
                                          use_cpu=True, disable_tqdm=True, save_strategy="no")
    trainer = SpeedkitTrainer(model=model, args=args, train_dataset=Tokens(), methods=methods)
    trainer.train()
    return trainer, model.eval()


def loss_of(model) -> float:
    ids = Tokens()[0]["input_ids"][None]
    with torch.no_grad():
        return model.eval()(input_ids=ids, labels=ids).loss.item()


def test_a_surgered_model_saved_by_the_trainer_reloads_as_trained(tmp_path):
    trainer, model = trained(tmp_path, [QKNorm(), RotaryEmbeddings(remove_position_embeddings=True), ReLUSquared()])
    trainer.save_model(str(tmp_path / "saved"))
    record = json.loads((tmp_path / "saved" / "config.json").read_text())["speedkit"]
    assert {s["name"] for s in record["surgeries"]} == {"qk_norm", "rotary_embeddings", "relu_squared"}

    reloaded = load_pretrained(tmp_path / "saved")
    assert loss_of(reloaded) == pytest.approx(loss_of(model), abs=1e-6)
    assert any(name.endswith("qk_norm.q_gain") for name, _ in reloaded.named_parameters())

    reloaded.save_pretrained(tmp_path / "again")  # a reloaded model records its surgeries too
    assert loss_of(load_pretrained(tmp_path / "again")) == pytest.approx(loss_of(model), abs=1e-6)
    config = json.loads((tmp_path / "again" / "config.json").read_text())
    config["speedkit"]["surgeries"] = [{"name": "relu_squared", "params": {}}]
    (tmp_path / "again" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"does not fit .* after the surgeries \['relu_squared'\]: saved tensors "
                                         r"that fit nowhere \[.*qk_norm"):
        load_pretrained(tmp_path / "again")  # QK-norm's gains, saved, fit nowhere without its surgery


@pytest.mark.parametrize("methods", [lambda: [QKNorm(), RotaryEmbeddings(), ReLUSquared()],
                                     lambda: [RotaryEmbeddings(), ReLUSquared()]],  # no new weights: no warning
                         ids=["new-weights", "same-weights"])
def test_transformers_own_from_pretrained_refuses_a_surgered_model_naming_the_loader(tmp_path, methods):
    trainer, model = trained(tmp_path, methods())
    model.save_pretrained(tmp_path / "saved")  # the library's own save, as a user calls it
    for model_class in (transformers.GPT2LMHeadModel, transformers.AutoModelForCausalLM):
        with pytest.raises(ValueError, match=REFUSED):
            model_class.from_pretrained(tmp_path / "saved")
    with pytest.raises(ValueError, match=r"speedkit's surgeries changed \(.*relu_squared.*\).*load_pretrained"):
        get_model(f"hf:{tmp_path / 'saved'}")
    assert loss_of(load_pretrained(tmp_path / "saved")) == pytest.approx(loss_of(model), abs=1e-6)


def test_a_plain_loop_marks_the_model_it_changed_and_an_unchanged_model_saves_plainly(tmp_path):
    torch.manual_seed(0)
    model = get_model("hf:gpt2-nano").model
    Speedkit([ReLUSquared()], max_duration="1ba").prepare_model(model)
    model.save_pretrained(tmp_path / "looped")
    with pytest.raises(ValueError, match=REFUSED):
        transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "looped")
    assert loss_of(load_pretrained(tmp_path / "looped")) == pytest.approx(loss_of(model), abs=1e-6)

    plain = get_model("hf:gpt2-nano").model
    Speedkit([], max_duration="1ba").prepare_model(plain)  # nothing changed: an ordinary folder
    plain.save_pretrained(tmp_path / "plain")
    assert "speedkit" not in json.loads((tmp_path / "plain" / "config.json").read_text())
    assert loss_of(transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "plain")) == pytest.approx(
        loss_of(plain), abs=1e-6)


def test_speedkits_own_trainer_marks_the_hugging_face_model_it_changed(tmp_path):
    from speedkit import Trainer

    model = get_model("hf:gpt2-nano")  # speedkit's wrapper around transformers' GPT2LMHeadModel
    loader = torch.utils.data.DataLoader(Tokens(), batch_size=8)
    Trainer(model, loader, max_duration="1ba", methods=[ReLUSquared()], device="cpu", run_dir=tmp_path / "runs",
            save_checkpoints=False, progress_bar=False).fit()
    model.model.save_pretrained(tmp_path / "saved")
    with pytest.raises(ValueError, match=REFUSED):
        transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "saved")
    assert loss_of(load_pretrained(tmp_path / "saved")) == pytest.approx(loss_of(model.model), abs=1e-6)


def test_a_folder_saved_before_the_config_record_still_reloads_with_its_surgeries(tmp_path):
    """Folders saved before config.json held the record kept the surgeries in speedkit_surgery.json: the loader
    still rebuilds them, rather than load the plain architecture from an unmarked config.json."""
    trainer, model = trained(tmp_path, [RotaryEmbeddings(remove_position_embeddings=True), ReLUSquared()])
    trainer.save_model(str(tmp_path / "saved"))
    config_file = tmp_path / "saved" / "config.json"
    config = json.loads(config_file.read_text())
    record = config.pop("speedkit")  # as the earlier version wrote it: config.json unmarked, the record beside it
    config["attn_implementation"] = record["attn_implementation"]
    config_file.write_text(json.dumps(config))
    (tmp_path / "saved" / "speedkit_surgery.json").write_text(json.dumps({"surgeries": record["surgeries"]}))

    assert loss_of(load_pretrained(tmp_path / "saved")) == pytest.approx(loss_of(model), abs=1e-6)
