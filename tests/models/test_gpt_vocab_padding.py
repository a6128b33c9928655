"""speedkit's GPT pads its embedding and head rows to a multiple of ``config.pad_vocab_to`` (64 by default), and no id
past ``vocab_size`` is ever produced or scored as a token: in eval mode or without autograd the pad logits hold the
dtype's lowest value (metrics, argmax, sampling), in training they stay as computed (no extra op in a step). Old checkpoints with
``vocab_size`` rows still load; a padded model's weights round-trip through safetensors."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from speedkit.models import GPT, GPTConfig, get_model, gpt_config
from speedkit.record.metrics import Accuracy, CrossEntropy

VOCAB = 300  # pads to 320 rows
SMALL = dict(vocab_size=VOCAB, n_layer=1, n_head=2, n_embd=32, block_size=32)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def _pair(**overrides):
    """A padded GPT and an unpadded one with the same weights on the real rows."""
    padded = GPT(GPTConfig(**SMALL, **overrides))
    plain = GPT(GPTConfig(**SMALL, pad_vocab_to=1, **overrides))
    state = {k: (v[:VOCAB] if v.size(0) == padded.config.padded_vocab_size else v)
             for k, v in padded.state_dict().items()}
    plain.load_state_dict(state)
    return padded, plain


def _make_pad_logits_huge(model: GPT, ids: torch.Tensor) -> None:
    """Point the pad rows along the final hidden states, so their raw logits dwarf every real one."""
    with torch.no_grad():
        hidden = model.transformer.ln_f(model.transformer.wte(ids))  # any hidden state will do as a direction
        direction = hidden.reshape(-1, hidden.size(-1)).mean(0)
        model.lm_head.weight[VOCAB:] = 1e3 * direction / direction.norm()


@pytest.mark.parametrize("vocab, multiple, rows", [(50257, 64, 50304), (256, 64, 256), (50257, 1, 50257),
                                                   (300, 128, 384)])
def test_rows_are_padded_to_the_multiple(vocab, multiple, rows):
    with torch.device("meta"):
        model = GPT(gpt_config("gpt2-124m", vocab_size=vocab, pad_vocab_to=multiple))
    assert model.config.vocab_size == vocab and model.config.padded_vocab_size == rows
    assert model.transformer.wte.weight.shape[0] == rows == model.lm_head.weight.shape[0]
    assert model.lm_head.weight is model.transformer.wte.weight  # still tied


def test_gpt2_preset_pads_and_counts_the_real_vocabulary():
    with torch.device("meta"):
        padded = get_model("gpt2-124m")
        plain = get_model("gpt2-124m", pad_vocab_to=1)
    assert padded.lm_head.out_features == 50304
    # the pad rows are the implementation's: parameters and FLOPs are the model's either way
    assert padded.num_params() == plain.num_params() == 124_439_808
    assert padded.num_params(non_embedding=True) == plain.num_params(non_embedding=True)
    assert padded.flops_per_token() == plain.flops_per_token()
    untied, untied_plain = (GPT(gpt_config("gpt-nano", vocab_size=VOCAB, tie_weights=False, pad_vocab_to=m))
                            for m in (64, 1))
    assert untied.num_params() == untied_plain.num_params()
    assert untied.flops_per_token() == untied_plain.flops_per_token()


@pytest.mark.parametrize("multiple", [0, -64, 2.5])
def test_bad_multiple_is_refused(multiple):
    with pytest.raises(ValueError, match="pad_vocab_to"):
        GPTConfig(pad_vocab_to=multiple)


def test_real_logits_and_evaluation_loss_match_an_unpadded_model():
    padded, plain = _pair()
    ids = torch.randint(0, VOCAB, (2, 16))
    targets = torch.randint(0, VOCAB, (2, 16))
    _make_pad_logits_huge(padded, ids)
    train_logits = padded(ids)
    assert train_logits.shape == (2, 16, 320)
    torch.testing.assert_close(train_logits[..., :VOCAB], plain(ids))  # the real rows are the same rows
    with torch.no_grad():
        eval_logits, reference = padded(ids), plain(ids)
    assert (eval_logits[..., VOCAB:] == torch.finfo(eval_logits.dtype).min).all()
    # the evaluation loss is exactly over the 300 real classes, though the raw pad logits are huge
    torch.testing.assert_close(padded.loss(eval_logits, (ids, targets)), plain.loss(reference, (ids, targets)))
    for metric_class in (CrossEntropy, Accuracy):
        scores = []
        for logits in (eval_logits, reference):
            metric = metric_class()
            metric.update(logits, targets)
            scores.append(metric.compute())
        assert scores[0] == pytest.approx(scores[1], rel=1e-5)


def test_argmax_metrics_and_sampling_never_pick_a_pad_id():
    model = GPT(GPTConfig(**SMALL))
    ids = torch.randint(0, VOCAB, (4, 16))
    _make_pad_logits_huge(model, ids)
    assert (model(ids).argmax(-1) >= VOCAB).float().mean() > 0.5  # unmasked, the pads would win most positions
    model.eval()
    with torch.no_grad():
        logits = model(ids)
    assert logits.argmax(-1).max() < VOCAB
    assert logits.topk(5, dim=-1).indices.max() < VOCAB
    accuracy = Accuracy(topk=5)
    accuracy.update(logits, logits[..., :VOCAB].argmax(-1))  # the model's own best real guesses are all right
    assert accuracy.compute() == 1.0
    for top_k in (None, 400):
        sampled = model.generate(ids[:, :2], max_new_tokens=20, top_k=top_k)
        assert sampled.max() < VOCAB


def test_training_loss_is_finite_and_pushes_pad_logits_down():
    model = GPT(GPTConfig(**SMALL))
    ids, targets = torch.randint(0, VOCAB, (2, 2, 16))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)

    def pad_share():
        return model(ids).float().softmax(-1)[..., VOCAB:].sum(-1).mean().item()

    before = pad_share()
    for _ in range(10):
        loss = model.loss(model(ids), (ids, targets))
        assert torch.isfinite(loss)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert pad_share() < before / 2  # no target names a pad id: training takes their share away


class _OpCounter(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))


def _step_ops(model: GPT, ids, targets) -> int:
    """Aten ops of a training step after the first (which checks the token ids once)."""
    model.loss(model(ids), (ids, targets)).backward()
    with _OpCounter() as counter:
        model.loss(model(ids), (ids, targets)).backward()
    return counter.ops


def test_a_training_step_dispatches_no_more_ops_than_unpadded():
    padded, plain = _pair()
    ids, targets = torch.randint(0, VOCAB, (2, 2, 16))
    assert _step_ops(padded, ids, targets) == _step_ops(plain, ids, targets)


@pytest.mark.parametrize("saved_multiple", [64, 1])  # 1: an export made before the padding
def test_exported_weights_load_into_a_fresh_model_with_the_same_outputs(tmp_path, saved_multiple):
    pytest.importorskip("safetensors")
    from safetensors.torch import load_file

    from speedkit.cli.export import export_weights
    from speedkit.record.runs import RunRecord
    from speedkit.train.checkpoint import save_checkpoint

    trained = GPT(GPTConfig(**SMALL, pad_vocab_to=saved_multiple))
    checkpoint = save_checkpoint(tmp_path / "ba000000001.ckpt", {
        "model": trained.state_dict(), "methods": {}, "record": RunRecord(status="completed").to_json()})
    exported = load_file(export_weights(checkpoint, out=tmp_path / "gpt.safetensors").path)
    assert exported["lm_head.weight"].shape[0] == trained.config.padded_vocab_size
    fresh = GPT(GPTConfig(**SMALL))
    fresh.load_state_dict(exported)
    assert fresh.lm_head.weight is fresh.transformer.wte.weight
    assert fresh.transformer.wte.weight.shape[0] == trained.config.padded_vocab_size
    ids = torch.randint(0, VOCAB, (2, 16))
    with torch.no_grad():
        got, expected = fresh(ids), trained(ids)
    torch.testing.assert_close(got[..., :VOCAB], expected[..., :VOCAB])
    assert got.argmax(-1).max() < VOCAB


@pytest.mark.parametrize("tie", [True, False])
def test_a_checkpoint_saved_before_the_padding_loads_and_trains(tie):
    old = GPT(GPTConfig(**SMALL, pad_vocab_to=1, tie_weights=tie))  # what a checkpoint of 300 rows came from
    ids, targets = torch.randint(0, VOCAB, (2, 2, 16))
    model = GPT(GPTConfig(**SMALL, tie_weights=tie))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)  # built before the load, as a resume does
    model.load_state_dict(old.state_dict())
    assert model.transformer.wte.weight.shape[0] == VOCAB == model.lm_head.out_features
    assert (model.lm_head.weight is model.transformer.wte.weight) == tie
    torch.testing.assert_close(model(ids), old(ids))
    model.loss(model(ids), (ids, targets)).backward()
    optimizer.step()  # the optimizer still holds the model's parameters, now of 300 rows
    assert model.num_params() == old.num_params()


def test_a_checkpoint_with_too_few_rows_is_refused():
    small = GPT(GPTConfig(**{**SMALL, "vocab_size": 200}, pad_vocab_to=1))
    with pytest.raises(RuntimeError, match="size mismatch for transformer.wte.weight"):
        GPT(GPTConfig(**SMALL)).load_state_dict(small.state_dict())


def test_model_surgeries_leave_the_padding_alone():
    import speedkit.functional as sf

    model = GPT(GPTConfig(**SMALL))
    sf.apply_rotary_embeddings(model, remove_position_embeddings=True)
    sf.apply_qk_norm(model)
    sf.apply_relu_squared(model)
    ids = torch.randint(0, VOCAB, (2, 16))
    _make_pad_logits_huge(model, ids)
    assert model.lm_head.weight is model.transformer.wte.weight
    assert model(ids).shape == (2, 16, 320)
    with torch.no_grad():
        assert model(ids).argmax(-1).max() < VOCAB


def test_compiled_training_and_evaluation_keep_the_contract():
    padded, plain = _pair()
    ids, targets = torch.randint(0, VOCAB, (2, 2, 16))
    _make_pad_logits_huge(padded, ids)
    eager_loss = padded.loss(padded(ids), (ids, targets))
    padded.compile(fullgraph=True, dynamic=False)
    torch.testing.assert_close(padded.loss(padded(ids), (ids, targets)), eager_loss)
    with torch.no_grad():
        logits = padded(ids)
        torch.testing.assert_close(F.cross_entropy(logits.reshape(-1, 320), targets.reshape(-1)),
                                   F.cross_entropy(plain(ids).reshape(-1, VOCAB), targets.reshape(-1)))
    assert logits.argmax(-1).max() < VOCAB


def test_the_trainers_evaluation_scores_only_real_ids(tmp_path):
    from speedkit import Trainer

    padded, plain = _pair()
    batches = [tuple(torch.randint(0, VOCAB, (2, 4, 16))) for _ in range(3)]
    _make_pad_logits_huge(padded, batches[0][0])
    trainer = Trainer(padded, batches[:1], eval_dataloader=batches, max_duration="1ba", device="cpu",
                      run_dir=tmp_path, save_checkpoints=False, progress_bar=False,
                      optimizers=lambda p: torch.optim.SGD(p, lr=0.0))  # the huge pad rows stay huge
    trainer.fit()
    scores = trainer.eval()["eval"]  # the default metrics: accuracy (an argmax) and cross-entropy
    with torch.no_grad():
        logits = torch.cat([plain(x) for x, _ in batches]).reshape(-1, VOCAB)
    targets = torch.cat([y for _, y in batches]).reshape(-1)
    assert scores["accuracy"] == pytest.approx((logits.argmax(-1) == targets).float().mean().item())
    assert scores["loss"] == pytest.approx(F.cross_entropy(logits, targets).item(), rel=1e-5)


def test_a_run_trained_before_the_padding_resumes(tmp_path):
    """The run's record counts the GPT's parameters without pad rows, so the padded model is the same experiment;
    its checkpoint (300 rows, AdamW and EMA state of that shape) loads into it and training goes on."""
    from speedkit import Trainer
    from speedkit.methods import get_method

    batches = [tuple(torch.randint(0, VOCAB, (2, 4, 16))) for _ in range(4)]

    def trainer(config: GPTConfig, duration: str, **resume) -> Trainer:
        return Trainer(GPT(config), batches, max_duration=duration, device="cpu", run_dir=tmp_path, run_name="old",
                       progress_bar=False, methods=[get_method("ema")],
                       optimizers=lambda p: torch.optim.AdamW(p, lr=1e-3), **resume)

    trainer(GPTConfig(**SMALL, pad_vocab_to=1), "2ba").fit()
    resumed = trainer(GPTConfig(**SMALL), "4ba", autoresume=True, extend_duration=True)
    record = resumed.fit()
    assert record.status == "completed" and resumed.state.timestamp.batch == 4
    assert resumed.state.model.transformer.wte.weight.shape[0] == VOCAB


def test_eval_mode_masks_the_pads_with_autograd_on_and_their_gradient_is_zero():
    model = GPT(GPTConfig(**SMALL)).eval()  # a user's evaluation loop that forgot torch.no_grad()
    ids, targets = torch.randint(0, VOCAB, (2, 2, 16))
    _make_pad_logits_huge(model, ids)
    logits = model(ids)
    assert logits.argmax(-1).max() < VOCAB
    model.loss(logits, (ids, targets)).backward()
    assert model.lm_head.weight.grad[VOCAB:].abs().max() == 0  # the pad rows did not score


def test_token_ids_past_the_vocabulary_are_refused_on_the_first_call_not_trained_on_pad_rows():
    """Ids in [vocab_size, padded rows) index pad rows, valid rows of the embedding: without a check a tokenizer
    with more tokens than the model trains silently where an unpadded model's embedding refused it. The first
    eager forward and the first loss check once; later calls read nothing from the device."""
    from speedkit.callbacks.sync_counter import SyncCounter

    model = GPT(GPTConfig(vocab_size=300, block_size=16, n_layer=1, n_head=2, n_embd=32))
    assert model.config.padded_vocab_size == 320
    bad = torch.tensor([[1, 2, 305]])
    with pytest.raises(ValueError, match="token id of the inputs is 305.*300 tokens.*vocab_size"):
        model(bad)
    good = torch.tensor([[1, 2, 3]])
    logits = model(good)
    with pytest.raises(ValueError, match="token id of the targets is 310"):
        model.loss(logits, (good, torch.tensor([[2, 3, 310]])))
    model.loss(logits, (good, torch.tensor([[2, 3, -1]])))  # the ignore index is not an id
    targets = torch.tensor([[2, 3, 4]])
    with SyncCounter() as counter:  # checked once: a later step reads nothing back
        model.loss(model(good), (good, targets))
    assert counter.total == 0
    fresh = GPT(GPTConfig(vocab_size=300, block_size=16, n_layer=1, n_head=2, n_embd=32))
    with SyncCounter() as first:  # the check the first step does, which the counter sees
        fresh.loss(fresh(good), (good, targets))
    assert first.total == 2
    unpadded = GPT(GPTConfig(vocab_size=256, block_size=16, n_layer=1, n_head=2, n_embd=32))
    with pytest.raises(IndexError):  # no pad rows: the embedding itself refuses, as before
        unpadded(torch.tensor([[1, 256]]))


def test_label_smoothing_spreads_its_mass_over_the_real_vocabulary_not_the_pads():
    from types import SimpleNamespace

    from speedkit.core.event import Event
    from speedkit.methods.label_smoothing import LabelSmoothing

    model = GPT(GPTConfig(**SMALL))
    ids = torch.randint(0, VOCAB, (2, 8))
    state = SimpleNamespace(model=torch.compile(model, backend="eager"), outputs=model(ids), batch=(ids, ids))
    state.batch_targets = lambda: state.batch[1]
    LabelSmoothing(smoothing=0.2).apply(Event.BEFORE_LOSS, state, None)
    smoothed = state.batch[1]
    assert smoothed.shape == (2, 8, model.config.padded_vocab_size)
    assert torch.all(smoothed[..., VOCAB:] == 0)  # no probability on an id that is no token
    torch.testing.assert_close(smoothed.sum(-1), torch.ones(2, 8))
    others = smoothed[..., :VOCAB].clone().scatter_(-1, ids.unsqueeze(-1), 0.0)
    torch.testing.assert_close(others.amax(-1), torch.full((2, 8), 0.2 / VOCAB))  # the real classes share it
