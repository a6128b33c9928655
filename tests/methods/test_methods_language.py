"""Language methods: attention interception, rotary, ALiBi, QK-norm, ReLU^2, GLU, sequence-length warmup.

Every surgery is checked on speedkit's GPT and on models built only from torch parts (an
nn.TransformerEncoder causal LM with nn.MultiheadAttention, and a hand-written SDPA attention).
"""
from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from method_harness import run_steps, tiny_language

from speedkit import Trainer
from speedkit.core import Event, IncompatibleMethodsError, Method, MethodCard
from speedkit.core.method import NothingToChangeError
from speedkit.methods import _attention as attention
from speedkit.methods.alibi import ALiBi, alibi_slopes, apply_alibi
from speedkit.methods.gated_linear_units import GatedLinearUnit, GatedLinearUnits, apply_gated_linear_units
from speedkit.methods.qk_norm import QKNorm, QKNormModule, apply_qk_norm
from speedkit.methods.relu_squared import ReLUSquared, ReLUSquaredModule, apply_relu_squared, find_mlp_blocks
from speedkit.methods.rotary_embeddings import RotaryEmbeddings, apply_rotary, apply_rotary_embeddings
from speedkit.methods.seq_length_warmup import SeqLengthWarmup, seq_length_at, split_sequences, truncate_sequences

VOCAB, T = 64, 12


# -- models built from torch parts only -------------------------------------------------------------

class TorchEncoderLM(nn.Module):
    """A causal LM from nn.TransformerEncoder (nn.MultiheadAttention inside) with learned positions."""

    def __init__(self, vocab=VOCAB, d=32, heads=4, layers=2, max_len=32):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos_emb = nn.Embedding(max_len, d)
        layer = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d, vocab)

    def forward(self, idx):
        t = idx.shape[1]
        x = self.tok(idx) + self.pos_emb(torch.arange(t, device=idx.device))
        mask = nn.Transformer.generate_square_subsequent_mask(t, device=idx.device)
        return self.head(self.encoder(x, mask=mask, is_causal=True))


class HandAttention(nn.Module):
    """Separate q/k/v/o projections; calls SDPA through a helper method (names unlike speedkit's GPT)."""

    def __init__(self, width=24, heads=3):
        super().__init__()
        self.heads = heads
        self.to_q, self.to_k, self.to_v, self.to_out = (nn.Linear(width, width) for _ in range(4))

    def _mix(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = (p(x).view(b, t, self.heads, -1).transpose(1, 2) for p in (self.to_q, self.to_k, self.to_v))
        return self.to_out(self._mix(q, k, v).transpose(1, 2).reshape(b, t, c))


class HandLM(nn.Module):
    def __init__(self, vocab=VOCAB, width=24, heads=3):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.mixer = HandAttention(width, heads)
        self.ff = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Dropout(0.0), nn.Linear(4 * width, width))
        self.out = nn.Linear(width, vocab)

    def forward(self, idx):
        x = self.embed(idx)
        x = x + self.mixer(x)
        return self.out(x + self.ff(x))


def gpt():
    torch.manual_seed(0)
    return tiny_language()[0]


def torch_lm():
    torch.manual_seed(0)
    return TorchEncoderLM()


def hand_lm():
    torch.manual_seed(0)
    return HandLM()


ALL_MODELS = [gpt, torch_lm, hand_lm]
TOKENS = torch.randint(0, VOCAB, (2, T), generator=torch.Generator().manual_seed(1))


class Recorder:
    """An attention transform that keeps what reaches SDPA and changes nothing."""

    def __init__(self):
        self.calls = []

    def __call__(self, q, k, v, attn_mask, is_causal, scale):
        self.calls.append(dict(q=q.detach(), k=k.detach(), mask=attn_mask, is_causal=is_causal))
        return q, k, v, attn_mask, is_causal, scale


def record_attention(model, order=100, name="recorder"):
    recorder = Recorder()
    for _, module in attention.find_attention_modules(model):
        attention.intercept_attention(module, recorder, name=name, order=order)
    return recorder


def assert_causal(model):
    """Changing token t leaves the outputs before t as they were (and changes those from t on)."""
    model.eval()
    changed = TOKENS.clone()
    changed[:, 6] = (changed[:, 6] + 1) % VOCAB
    with torch.no_grad():
        a, b = model(TOKENS), model(changed)
    torch.testing.assert_close(a[:, :6], b[:, :6], atol=1e-5, rtol=1e-5)
    assert not torch.allclose(a[:, 6:], b[:, 6:])


def events_in_run(method, steps=2, tmp_path=None, setup=None, **kwargs):
    trainer = run_steps(setup or tiny_language(), [method], steps=steps, tmp_path=tmp_path, **kwargs)
    return trainer, trainer.engine.events_of(method.name)


# -- _attention: finding and intercepting ------------------------------------------------------------

def test_find_attention_modules_by_structure_innermost_only():
    assert [n for n, _ in attention.find_attention_modules(gpt())] == [f"transformer.h.{i}.attn" for i in range(2)]
    assert [n for n, _ in attention.find_attention_modules(torch_lm())] == [
        "encoder.layers.0.self_attn", "encoder.layers.1.self_attn"]
    assert [n for n, _ in attention.find_attention_modules(hand_lm())] == ["mixer"]
    assert attention.find_attention_modules(nn.Sequential(nn.Linear(2, 2))) == []


@pytest.mark.parametrize("make", ALL_MODELS)
def test_identity_interception_keeps_outputs_state_dict_and_is_removable(make):
    model = make()
    keys = list(model.state_dict())
    with torch.no_grad():
        train_out = model(TOKENS)
    recorder = record_attention(model)
    with torch.no_grad():
        torch.testing.assert_close(model(TOKENS), train_out, atol=1e-5, rtol=1e-5)
        assert len(recorder.calls) == len(attention.find_attention_modules(model))
        assert recorder.calls[0]["q"].dim() == 4  # [B, H, T, D]
        model.eval()  # eval: nn.TransformerEncoderLayer's fused path must not bypass the interception
        recorder.calls.clear()
        torch.testing.assert_close(model(TOKENS), train_out, atol=1e-5, rtol=1e-5)
        assert len(recorder.calls) == len(attention.find_attention_modules(model))
    assert list(model.state_dict()) == keys
    copied = copy.deepcopy(model)  # the wrapper follows the copy, not the original
    copied_module = attention.find_attention_modules(copied)[0][1]
    assert copied_module.forward.module is copied_module
    for _, module in attention.find_attention_modules(model):
        assert attention.intercepted_transforms(module) == ["recorder"]
        assert attention.remove_interception(module)
        assert "forward" not in module.__dict__ and not module._forward_pre_hooks
    recorder.calls.clear()
    model(TOKENS)
    assert recorder.calls == []


def test_multihead_attention_through_sdpa_matches_torch():
    torch.manual_seed(0)
    for batch_first in (True, False):
        mha = nn.MultiheadAttention(16, 4, batch_first=batch_first)
        x = torch.randn(2, 5, 16) if batch_first else torch.randn(5, 2, 16)
        mask = nn.Transformer.generate_square_subsequent_mask(5)
        padding = torch.tensor([[0.0] * 5, [0.0] * 3 + [float("-inf")] * 2])
        for kwargs in ({}, {"attn_mask": mask}, {"attn_mask": mask, "key_padding_mask": padding},
                       {"attn_mask": mask, "is_causal": True}):
            expected = mha(x, x, x, need_weights=False, **kwargs)[0]
            got = attention.multihead_attention_through_sdpa(mha, x, x, x, **kwargs)
            torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_intercepted_multihead_attention_warns_when_weights_are_asked_for():
    mha = nn.MultiheadAttention(16, 4, batch_first=True)
    attention.intercept_attention(mha, Recorder())
    x = torch.randn(2, 5, 16)
    with pytest.warns(UserWarning, match="need_weights"):
        out, weights = mha(x, x, x)
    assert weights is None and out.shape == x.shape


# -- rotary_embeddings ------------------------------------------------------------------------------

def test_rotary_logits_depend_only_on_relative_position():
    torch.manual_seed(0)
    q_vec, k_vec = torch.randn(16), torch.randn(16)
    positions = torch.arange(10)
    q = apply_rotary(q_vec.expand(10, 16), positions)
    k = apply_rotary(k_vec.expand(10, 16), positions)
    logits = q @ k.T
    for shift in (1, 3):
        torch.testing.assert_close(logits[shift:, shift:], logits[:-shift, :-shift], atol=1e-4, rtol=1e-4)
    assert not torch.allclose(logits[0, 0], logits[5, 0])  # without rotation every entry would be equal
    torch.testing.assert_close(q.norm(dim=-1), q_vec.norm().expand(10))  # rotations keep lengths


@pytest.mark.parametrize("make", ALL_MODELS)
def test_rotary_surgery_rotates_q_and_k_reaching_sdpa_and_keeps_causality(make):
    model = make()
    before = record_attention(model, order=5, name="before")   # sees q, k before the rotation (order 10)
    report = apply_rotary_embeddings(model)
    after = record_attention(model, order=15)
    assert report.changed == {"attention modules": len(attention.find_attention_modules(model))}
    with torch.no_grad():
        model(TOKENS)
    first, rotated = before.calls[0], after.calls[0]
    positions = torch.arange(T)
    torch.testing.assert_close(rotated["q"], apply_rotary(first["q"], positions))
    torch.testing.assert_close(rotated["k"], apply_rotary(first["k"], positions))
    assert not torch.allclose(rotated["q"], first["q"])
    assert_causal(model)


def test_rotary_keeps_or_removes_learned_positions_and_skips_own_rotary():
    model = gpt()
    report = apply_rotary_embeddings(model)
    assert any("transformer.wpe kept" in d for d in report.details)
    assert model.transformer.wpe.weight.requires_grad
    model = torch_lm()
    report = apply_rotary_embeddings(model, remove_position_embeddings=True)
    assert report.changed["position embeddings zeroed and frozen"] == 1
    assert not model.pos_emb.weight.requires_grad and model.pos_emb.weight.abs().sum() == 0
    already = tiny_language(positions="rotary")[0]
    with pytest.raises(NothingToChangeError, match="rotary_embeddings found no attention"):
        apply_rotary_embeddings(already)
    assert apply_rotary_embeddings(already, allow_empty=True).total == 0


# -- alibi ------------------------------------------------------------------------------------------

def test_alibi_slopes_are_geometric():
    torch.testing.assert_close(alibi_slopes(8), torch.tensor([2.0 ** -(i + 1) for i in range(8)]))
    torch.testing.assert_close(alibi_slopes(4), torch.tensor([2.0 ** (-2 * (i + 1)) for i in range(4)]))


@pytest.mark.parametrize("make", ALL_MODELS)
def test_alibi_adds_minus_slope_times_distance_under_the_causal_mask(make):
    model = make()
    report = apply_alibi(model)
    recorder = record_attention(model)
    with torch.no_grad():
        model(TOKENS)
    call = recorder.calls[0]
    heads = call["q"].shape[1]
    mask = call["mask"].expand(heads, T, T) if call["mask"].dim() == 3 else call["mask"][0]
    assert call["is_causal"] is False
    i, j = torch.meshgrid(torch.arange(T), torch.arange(T), indexing="ij")
    expected = -alibi_slopes(heads)[:, None, None] * (i - j).float()
    lower = (j <= i).expand(heads, T, T)
    torch.testing.assert_close(mask[lower], expected[lower])
    assert torch.isneginf(mask[~lower]).all()
    assert report.changed.get("position embeddings zeroed and frozen", 0) == (0 if make is hand_lm else 1)
    assert_causal(model)


def test_alibi_attention_runs_in_a_fused_kernel_and_a_bias_built_in_evaluation_serves_training():
    """The bias reaches SDPA in the shape its fused CPU kernel takes (a 3-D one sends it to the unfused math
    kernel, which stores every score for the backward); one bias is built per shape and shared, and one first
    built under inference_mode (an evaluation) still works in the next training step's backward."""
    from torch.profiler import profile

    model = gpt()
    apply_alibi(model)
    with torch.inference_mode():
        model(TOKENS)
    with profile() as trace:
        F.cross_entropy(model(TOKENS).flatten(0, 1), TOKENS.flatten()).backward()
    kernels = {event.key for event in trace.key_averages()}
    assert "aten::_scaled_dot_product_flash_attention_for_cpu" in kernels
    assert "aten::_scaled_dot_product_attention_math" not in kernels
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_alibi_removes_learned_positions_by_default():
    model = gpt()
    apply_alibi(model)
    assert model.transformer.wpe.weight.abs().sum() == 0 and not model.transformer.wpe.weight.requires_grad
    kept = gpt()
    report = apply_alibi(kept, remove_position_embeddings=False)
    assert kept.transformer.wpe.weight.requires_grad and any("wpe kept" in d for d in report.details)


class BatchShapes(Method):
    """Remembers the input shape of every training batch, as the model will see it."""

    CARD = MethodCard(name="batch_shapes", summary="test helper", domain="any", events=(Event.BATCH_START,))

    def __init__(self):
        super().__init__()
        self.shapes = []

    def apply(self, event, state, logger):
        self.shapes.append(tuple(state.batch[0].shape) + tuple(state.batch[1].shape))


def test_alibi_events_and_shorter_training_sequences(tmp_path):
    shapes = BatchShapes()
    method = ALiBi(train_sequence_length_scaling=0.5)
    trainer = run_steps(tiny_language(), [method, shapes], steps=2, tmp_path=tmp_path)
    assert trainer.engine.events_of("alibi") == {Event.INIT: 1, Event.AFTER_DATALOADER: 2}
    assert shapes.shapes == [(4, 8, 4, 8)] * 2
    assert "alibi: changed 2 attention modules" in trainer.record.notes["surgery"][0]
    _, events = events_in_run(ALiBi(), tmp_path=tmp_path)
    assert events == {Event.INIT: 1}  # full-length training: nothing to do after the dataloader


def test_alibi_and_rotary_both_take_the_positions_role(tmp_path):
    model, train, _ = tiny_language()
    with pytest.raises(IncompatibleMethodsError, match="positions"):
        Trainer(model, train, methods=[ALiBi(), RotaryEmbeddings()], device="cpu", run_dir=tmp_path)


# -- qk_norm ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("make", ALL_MODELS)
def test_qk_norm_gives_unit_rms_q_and_k_per_head(make):
    model = make()
    report = apply_qk_norm(model)
    recorder = record_attention(model)
    with torch.no_grad():
        model(TOKENS)
    for call in recorder.calls:
        for x in (call["q"], call["k"]):
            torch.testing.assert_close(x.pow(2).mean(-1).sqrt(), torch.ones(x.shape[:-1]), atol=1e-3, rtol=1e-3)
    names = [n for n in model.state_dict() if n.endswith("qk_norm.q_gain")]
    assert len(names) == report.total == len(attention.find_attention_modules(model))
    assert_causal(model)


def test_qk_norm_gains_learn_and_are_in_the_optimizer(tmp_path):
    trainer, events = events_in_run(QKNorm(), tmp_path=tmp_path)
    assert events == {Event.INIT: 1}
    model = trainer.state.model
    gains = [m.q_gain for m in model.modules() if isinstance(m, QKNormModule)]
    assert len(gains) == 2
    in_optimizer = {id(p) for group in trainer.state.optimizers[0].param_groups for p in group["params"]}
    assert all(id(g) in in_optimizer for g in gains)
    assert not torch.allclose(gains[0], torch.ones_like(gains[0]))  # they trained


# -- relu_squared -----------------------------------------------------------------------------------

def test_relu_squared_on_gpt_uses_the_activation_name_protocol():
    model = gpt()
    report = apply_relu_squared(model)
    assert report.changed == {"MLP activations": 2}
    mlp = model.transformer.h[0].mlp
    assert mlp.activation == "relu2"
    x = torch.randn(3, 32)
    torch.testing.assert_close(mlp(x), mlp.proj(F.relu(mlp.fc(x)) ** 2))


def test_relu_squared_on_torch_models_swaps_modules_and_functions():
    model = hand_lm()
    apply_relu_squared(model)
    assert isinstance(model.ff[1], ReLUSquaredModule)
    x = torch.randn(3, 24)
    torch.testing.assert_close(model.ff(x), model.ff[3](F.relu(model.ff[0](x)) ** 2))
    model = torch_lm()
    report = apply_relu_squared(model)
    layer = model.encoder.layers[0]
    assert report.total == 2 and isinstance(layer.activation, ReLUSquaredModule) and layer.activation_relu_or_gelu == 0
    h = torch.randn(3, 32)
    torch.testing.assert_close(layer._ff_block(h), layer.linear2(F.relu(layer.linear1(h)) ** 2))
    assert_causal(model)


def test_mlp_blocks_are_found_by_structure_only():
    attention_like = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8))  # no activation between: not an MLP
    assert find_mlp_blocks(attention_like) == []
    assert [b.name for b in find_mlp_blocks(gpt())] == ["transformer.h.0.mlp", "transformer.h.1.mlp"]
    with pytest.raises(NothingToChangeError, match="relu_squared found no MLP"):
        apply_relu_squared(attention_like)
    assert apply_relu_squared(attention_like, allow_empty=True).total == 0


def test_relu_squared_events(tmp_path):
    trainer, events = events_in_run(ReLUSquared(), tmp_path=tmp_path)
    assert events == {Event.INIT: 1}
    assert trainer.state.model.transformer.h[1].mlp.activation == "relu2"


# -- gated_linear_units -----------------------------------------------------------------------------

def test_gated_linear_unit_computes_act_gate_times_value():
    torch.manual_seed(0)
    for activation, act in (("gelu", F.gelu), ("silu", F.silu)):
        glu = GatedLinearUnit(6, 5, activation)
        x = torch.randn(4, 6)
        gate_w, value_w = glu.proj.weight.chunk(2)
        gate_b, value_b = glu.proj.bias.chunk(2)
        torch.testing.assert_close(glu(x), act(x @ gate_w.T + gate_b) * (x @ value_w.T + value_b))


@pytest.mark.parametrize("make", ALL_MODELS)
def test_glu_surgery_keeps_parameter_count_and_runs(make):
    model = make()
    before = sum(p.numel() for p in model.parameters())
    report = apply_gated_linear_units(model, activation="silu")
    after = sum(p.numel() for p in model.parameters())
    assert report.total >= 1 and abs(after - before) / before < 0.01
    glus = [m for m in model.modules() if isinstance(m, GatedLinearUnit)]
    assert len(glus) == report.total and all(g.activation == "silu" for g in glus)
    assert find_mlp_blocks(model) == []  # no plain d -> h -> d block left
    assert_causal(model)


def test_glu_block_output_is_second_of_glu_with_no_extra_activation():
    model = gpt()
    apply_gated_linear_units(model)
    mlp = model.transformer.h[0].mlp
    x = torch.randn(3, 32)
    torch.testing.assert_close(mlp(x), mlp.proj(mlp.fc(x)))  # GPT's own GELU is not applied on top
    assert mlp.fc.out_features == round(4 * 32 * 2 / 3) == mlp.proj.in_features
    model = hand_lm()
    apply_gated_linear_units(model)
    assert isinstance(model.ff[1], nn.Identity)
    torch.testing.assert_close(model.ff(torch.randn(3, 24)[None])[0].shape, torch.Size([3, 24]))


def test_glu_events_and_conflict_with_relu_squared(tmp_path):
    trainer, events = events_in_run(GatedLinearUnits(), tmp_path=tmp_path)
    assert events == {Event.INIT: 1}
    assert isinstance(trainer.state.model.transformer.h[0].mlp.fc, GatedLinearUnit)
    model, train, _ = tiny_language()
    with pytest.raises(IncompatibleMethodsError, match="mlp_activation"):
        Trainer(model, train, methods=[GatedLinearUnits(), ReLUSquared()], device="cpu",
                run_dir=tmp_path)


# -- seq_length_warmup ------------------------------------------------------------------------------

def test_seq_length_schedule_values():
    assert seq_length_at(0.0, 128) == 8
    assert seq_length_at(0.15, 128) == 64          # halfway through the 0.3 warmup: 8 + 120/2 = 68 -> 64
    assert seq_length_at(0.3, 128) == 128 and seq_length_at(0.9, 128) == 128
    lengths = [seq_length_at(f / 100, 128) for f in range(0, 31)]
    assert lengths == sorted(lengths) and all(n % 8 == 0 for n in lengths)
    assert seq_length_at(0.5, 64, min_seq_length=4, duration=1.0, step_size=4) == 32
    assert seq_length_at(0.0, 4, min_seq_length=8) == 4  # never longer than the data


def test_truncate_and_split_keep_inputs_and_targets_aligned():
    idx = torch.arange(32).view(2, 16)
    batch = (idx, idx + 1)
    short = truncate_sequences(batch, 6)
    assert short[0].shape == (2, 6) and torch.equal(short[1], short[0] + 1)
    pieces = split_sequences(batch, 8)
    assert pieces[0].shape == (4, 8) and torch.equal(pieces[1], pieces[0] + 1)
    assert pieces[0].numel() == idx.numel()
    dense = split_sequences((idx, torch.zeros(2, 16, 5)), 4)
    assert dense[0].shape == (8, 4) and dense[1].shape == (8, 4, 5)


@pytest.mark.parametrize("truncate", [True, False])
def test_seq_length_warmup_in_training(truncate, tmp_path):
    shapes = BatchShapes()
    method = SeqLengthWarmup(min_seq_length=4, duration=1.0, step_size=4, truncate=truncate)
    trainer = run_steps(tiny_language(), [method, shapes], steps=4, tmp_path=tmp_path)
    assert trainer.engine.events_of("seq_length_warmup") == {Event.AFTER_DATALOADER: 4}
    lengths = [seq_length_at(i / 4, 16, 4, 1.0, 4) for i in range(4)]
    assert lengths == [4, 4, 8, 12]
    if truncate:
        assert shapes.shapes == [(4, n, 4, n) for n in lengths]
    else:  # the same tokens per step, in more and shorter sequences (64 // n of them)
        assert shapes.shapes == [(64 // n, n, 64 // n, n) for n in lengths]
        assert [a * b for a, b, _, _ in shapes.shapes] == [64, 64, 64, 60]  # 12 does not divide 64
    assert trainer.state.timestamp.token == sum(a * b for a, b, _, _ in shapes.shapes)


# -- parameters -------------------------------------------------------------------------------------

@pytest.mark.parametrize("cls, params", [
    (RotaryEmbeddings, {"base": 10.0}), (ALiBi, {"train_sequence_length_scaling": 0.0}),
    (QKNorm, {"eps": 1.0}), (GatedLinearUnits, {"hidden_fraction": 2.0}),
    (GatedLinearUnits, {"activation": "tanh"}), (SeqLengthWarmup, {"duration": 1.5}),
    (SeqLengthWarmup, {"min_seq_length": 0}),
])
def test_out_of_range_parameters_are_refused(cls, params):
    with pytest.raises(ValueError, match=f"{cls.CARD.name}.{next(iter(params))}"):
        cls(**params)


@pytest.mark.parametrize("apply", [apply_rotary_embeddings, apply_alibi, apply_qk_norm])
def test_attention_surgeries_refuse_models_without_attention(apply):
    model = nn.Sequential(nn.Embedding(10, 8), nn.Linear(8, 10))
    with pytest.raises(NothingToChangeError):
        apply(model)
    assert apply(model, allow_empty=True).total == 0


def test_surgeries_compose_on_one_model():
    model = torch_lm()
    apply_qk_norm(model)
    apply_rotary_embeddings(model, remove_position_embeddings=True)
    apply_gated_linear_units(model)
    module = attention.find_attention_modules(model)[0][1]
    assert attention.intercepted_transforms(module) == ["qk_norm", "rotary_embeddings"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model.train()
        loss = F.cross_entropy(model(TOKENS).flatten(0, 1), TOKENS.flatten())
    loss.backward()
    assert module.qk_norm.q_gain.grad is not None
    assert_causal(model)


def test_rotary_surgery_matches_gpts_built_in_rotary():
    """Same weights: speedkit GPT with positions="rotary" == a learned-positions GPT after the surgery."""
    built_in = tiny_language(positions="rotary")[0]
    model = gpt()
    missing, unexpected = model.load_state_dict(built_in.state_dict(), strict=False)
    assert missing == ["transformer.wpe.weight"] and unexpected == []
    apply_rotary_embeddings(model, remove_position_embeddings=True)
    with torch.no_grad():
        torch.testing.assert_close(model(TOKENS), built_in(TOKENS), atol=1e-5, rtol=1e-5)
