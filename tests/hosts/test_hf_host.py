"""speedkit's methods in a real ``transformers.Trainer.train`` on a small text folder: the language recipe's
methods on Hugging Face GPT-2, EMA evaluated in place of the raw weights, the methods' state through the
Trainer's own checkpoints (a kill and a resume end as an uninterrupted run), and the callback's refusals."""
from __future__ import annotations

import shutil

import pytest
import torch
from prerequisites import import_or_missing

transformers = import_or_missing("transformers", "pip install 'torch-speedkit[hf]'")

from speedkit.core import Event  # noqa: E402
from speedkit.data.text import DEFAULT_TEXT_ROOT  # noqa: E402
from speedkit.hosts import HostCannotServeError, OptimizerGroup  # noqa: E402
from speedkit.hosts.hf import SpeedkitCallback, SpeedkitTrainer  # noqa: E402
from speedkit.methods import (EMA, MixUp, Muon, QKNorm, ReLUSquared,  # noqa: E402
                              RotaryEmbeddings, SeqLengthWarmup)
from speedkit.models import get_model  # noqa: E402

pytestmark = pytest.mark.prerequisite("python-docs")
SEQUENCE = 64


class ByteSequences(torch.utils.data.Dataset):
    """A small text folder as causal-LM examples the Hugging Face way: labels = input_ids (the model shifts)."""

    def __init__(self, folder, count: int = 48):
        data = torch.tensor(list(b"".join(p.read_bytes() for p in sorted(folder.glob("*.txt")))), dtype=torch.long)
        self.rows = data[: count * SEQUENCE].view(count, SEQUENCE)

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return {"input_ids": self.rows[i], "labels": self.rows[i]}


@pytest.fixture(scope="module")
def text_folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("text")
    for path in sorted((DEFAULT_TEXT_ROOT / "tutorial").glob("*.rst.txt"))[:4]:
        shutil.copy(path, root / path.name)
    return root


def arguments(tmp_path, **overrides):
    settings = dict(output_dir=str(tmp_path / "out"), max_steps=6, per_device_train_batch_size=8, learning_rate=2e-3,
                    lr_scheduler_type="constant", logging_steps=100, save_strategy="no", report_to=[], use_cpu=True,
                    disable_tqdm=True, seed=0, dataloader_num_workers=0)
    return transformers.TrainingArguments(**{**settings, **overrides})


def language_methods():
    return [RotaryEmbeddings(remove_position_embeddings=True), QKNorm(), ReLUSquared(),
            Muon(lr=0.02), SeqLengthWarmup(duration=0.5, min_seq_length=16, truncate=True), EMA(half_life="2ba")]


def gpt2():
    """transformers' GPT2LMHeadModel (gpt-nano's sizes, built from a config), computing its own loss."""
    torch.manual_seed(0)
    model = get_model("hf:gpt2-nano").model
    model.lengths = []
    model.register_forward_pre_hook(lambda module, args, kwargs: module.lengths.append(kwargs["input_ids"].shape[1]),
                                    with_kwargs=True)
    return model


def test_the_language_methods_run_in_the_hugging_face_trainer(text_folder, tmp_path):
    model = gpt2()
    data = ByteSequences(text_folder)
    trainer = SpeedkitTrainer(model=model, args=arguments(tmp_path, eval_strategy="steps", eval_steps=3),
                              train_dataset=data, eval_dataset=torch.utils.data.Subset(data, range(8)),
                              methods=language_methods())
    trainer.train()
    session = trainer.speedkit
    changed = {note.split(":")[0] for note in session.record.notes["surgery"]}
    assert changed == {"rotary_embeddings", "qk_norm", "relu_squared", "muon"}
    assert isinstance(trainer.optimizer.optimizer, OptimizerGroup)  # inside the Trainer's AcceleratedOptimizer
    training = [n for n in model.lengths if n != SEQUENCE]
    assert training and training == sorted(training) and model.lengths[-1] == SEQUENCE  # warmup by max_steps
    ema = next(m for m in session.methods if m.name == "ema")
    assert ema.updates == 6 and session.state.timestamp.batch == 6 and session.state.timestamp.token > 0
    assert session.engine.events_of("ema")[Event.EVAL_START] == 2  # evaluated with the average, twice


class Kill(transformers.TrainerCallback):
    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step == 4:
            raise RuntimeError("killed")


def test_a_kill_and_resume_through_the_trainers_checkpoints_ends_as_an_uninterrupted_run(text_folder, tmp_path):
    data = ByteSequences(text_folder)
    whole = SpeedkitTrainer(model=gpt2(), args=arguments(tmp_path / "whole"), train_dataset=data,
                            methods=language_methods())
    whole.train()

    killed = SpeedkitTrainer(model=gpt2(), args=arguments(tmp_path / "killed", save_strategy="steps", save_steps=2),
                             train_dataset=data, methods=language_methods(), callbacks=[Kill()])
    with pytest.raises(RuntimeError, match="killed"):
        killed.train()
    checkpoint = tmp_path / "killed" / "out" / "checkpoint-4"
    assert (checkpoint / "speedkit_methods.pt").is_file()

    torch.manual_seed(1)
    resumed = SpeedkitTrainer(model=gpt2(), args=arguments(tmp_path / "killed"), train_dataset=data,
                              methods=language_methods())
    resumed.train(resume_from_checkpoint=str(checkpoint))
    ours, theirs = resumed.model.state_dict(), whole.model.state_dict()
    for name in theirs:
        assert torch.allclose(ours[name], theirs[name], atol=1e-5), name  # EMA's final average, Muon's steps
    assert resumed.speedkit.state.timestamp.batch == 6

    longer = SpeedkitTrainer(model=gpt2(), args=arguments(tmp_path / "killed", max_steps=12), train_dataset=data,
                             methods=language_methods())
    with pytest.raises(HostCannotServeError, match=r"was 6ba long, 67% of the way through it, and this one is 12ba "
                                                   r"long \(33% of the way\).*resume with the max_steps"):
        longer.train(resume_from_checkpoint=str(checkpoint))


@pytest.mark.parametrize("method, message", [
    (MixUp(), "mixup cannot run in a transformers.Trainer callback: it changes the labels.*batches are dicts"),
    (SeqLengthWarmup(), "seq_length_warmup needs after_dataloader.*SpeedkitTrainer in place of transformers.Trainer"),
    (Muon(), "muon cannot run in a transformers.Trainer callback: it changes or replaces the optimizer.*SpeedkitTrainer"),
    (EMA(), "ema needs eval_start, eval_end.*SpeedkitTrainer"),
])
def test_a_callback_alone_refuses_what_it_cannot_serve(text_folder, tmp_path, method, message):
    with pytest.raises(HostCannotServeError, match=message):
        transformers.Trainer(model=gpt2(), args=arguments(tmp_path), train_dataset=ByteSequences(text_folder),
                             callbacks=[SpeedkitCallback([method])])


def test_gradient_accumulation_equals_the_whole_batch_on_a_model_that_computes_its_own_loss(text_folder, tmp_path):
    """GPT-2's forward takes loss keywords (num_items_in_batch), so the Trainer would leave its loss unscaled:
    SpeedkitTrainer's loss is each microbatch's mean, which the Trainer divides by the step's microbatches. SGD
    without clipping, where the gradient's scale shows (Adam, Muon and clipping to a norm hide it)."""
    def run(batch, accumulation):
        model = gpt2()
        methods = [RotaryEmbeddings(), QKNorm(), ReLUSquared(), EMA(half_life="2ba"),
                   SeqLengthWarmup(duration=0.5, min_seq_length=16, truncate=True)]
        trainer = SpeedkitTrainer(model=model, args=arguments(tmp_path / str(accumulation), optim="sgd",
                                                              learning_rate=0.5, max_grad_norm=0.0,
                                                              per_device_train_batch_size=batch,
                                                              gradient_accumulation_steps=accumulation),
                                  train_dataset=ByteSequences(text_folder), methods=methods)
        trainer.train()
        ema = next(m for m in trainer.speedkit.methods if m.name == "ema")
        return model, trainer.speedkit.state.timestamp, ema.updates

    whole, whole_clock, whole_updates = run(8, 1)
    accumulated, clock, updates = run(4, 2)
    assert (clock.batch, clock.sample, clock.token) == (whole_clock.batch, whole_clock.sample, whole_clock.token)
    assert clock.batch == updates == whole_updates == 6 and clock.sample == 48
    for key, value in whole.state_dict().items():
        torch.testing.assert_close(accumulated.state_dict()[key], value, rtol=1e-4, atol=1e-5, msg=key)


def test_gradient_clipping_under_fp16_unscales_the_gradients_once_before_it_clips(tmp_path):
    """TrainingArguments(fp16=True) with speedkit's gradient clipping (which needs max_grad_norm=0): the gradients
    are still scaled at on_pre_optimizer_step, where the callback clips them, since accelerate unscales them only in
    its step. The callback unscales them first with accelerate's scaler (once; the scaler's step then does not), so
    the run is the unscaled run's. fp16 needs a GPU in the Trainer: here its hooks are driven as it drives them,
    with a GradScaler on the CPU where accelerate's would be."""
    from types import SimpleNamespace

    from speedkit.methods import GradientClipping

    args = arguments(tmp_path, max_steps=4, max_grad_norm=0)

    def run(scaler):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
        data = torch.utils.data.TensorDataset(torch.randn(32, 8), torch.randint(0, 3, (32,)))
        loader = torch.utils.data.DataLoader(data, batch_size=8)
        sgd = torch.optim.SGD(model.parameters(), lr=0.5)
        accelerated = SimpleNamespace(optimizer=sgd, scaler=scaler)  # what accelerate's prepared optimizer holds
        callback, state = SpeedkitCallback([GradientClipping(clipping_threshold=0.05)]), transformers.TrainerState()
        state.max_steps = 4
        control = transformers.TrainerControl()
        callback.on_init_end(args, state, control, model=model)
        callback.on_train_begin(args, state, control, model=model, optimizer=accelerated, train_dataloader=loader)
        for x, y in loader:
            callback.on_step_begin(args, state, control)
            loss = torch.nn.functional.cross_entropy(model(x), y)
            (loss if scaler is None else scaler.scale(loss)).backward()
            callback.on_pre_optimizer_step(args, state, control)
            if scaler is None:
                sgd.step()
            else:
                scaler.step(sgd)
                scaler.update()
            sgd.zero_grad()
            callback.on_step_end(args, state, control)
        return model

    plain, scaled = run(None), run(torch.amp.GradScaler("cpu", init_scale=2.0 ** 16))
    for ours, theirs in zip(scaled.state_dict().values(), plain.state_dict().values()):
        assert torch.allclose(ours, theirs, atol=1e-6)
