"""Vision model surgery methods: residual-block finder, blurpool, squeeze-excite, stochastic depth, ghost BN,
weight standardization, factorize, low-precision norms, patch whitening, identity init, gyro dropout."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from method_harness import run_steps, tiny_language, tiny_vision

from speedkit.core import Event
from speedkit.core.method import NothingToChangeError
from speedkit.methods import REGISTRY
from speedkit.methods._surgery import find_residual_blocks
from speedkit.methods.blurpool import BlurConv2d, MaxBlurPool2d, apply_blurpool, blur_2d
from speedkit.methods.factorize import FactorizedConv2d, FactorizedLinear, apply_factorization
from speedkit.methods.ghost_batchnorm import apply_ghost_batchnorm
from speedkit.methods.gyro_dropout import GyroDropoutLayer, apply_gyro_dropout
from speedkit.methods.identity_init import apply_identity_init
from speedkit.methods.low_precision_groupnorm import apply_low_precision_groupnorm
from speedkit.methods.low_precision_layernorm import apply_low_precision_layernorm
from speedkit.methods.patch_whitening import (WhitenedConv2d, add_missing_parameters, apply_patch_whitening,
                                              whitening_conv_from_images)
from speedkit.methods.squeeze_excite import SqueezeExciteConv2d, apply_squeeze_excite
from speedkit.methods.stochastic_depth import apply_stochastic_depth, stochastic_depth_layers
from speedkit.methods.weight_standardization import apply_weight_standardization
from speedkit.models import get_model


def resnet18():
    return get_model("resnet18", in_channels=3, small_input=True)


def resnet8():
    return get_model("resnet8")


def gpt(**config):
    return tiny_language(**config)[0]


def images_for(model, n=4, size=16):
    channels = 3 if hasattr(model, "conv1") else 1
    return torch.randn(n, channels, size, size, generator=torch.Generator().manual_seed(1))


# ---------------------------------------------------------------------------------------------
# residual blocks

def test_find_residual_blocks_by_structure_in_both_libraries():
    tv_model, sk_model = resnet18(), resnet8()
    state = torch.random.get_rng_state()
    tv, sk = find_residual_blocks(tv_model), find_residual_blocks(sk_model)
    assert torch.equal(state, torch.random.get_rng_state())  # the check does not shift the RNG stream
    assert [b.name for b in tv] == [f"layer{i}.{j}" for i in range(1, 5) for j in range(2)]
    assert {b.kind for b in tv} == {"torchvision"} and all(b.last_norm is b.module.bn2 for b in tv)
    assert [b.name for b in sk] == ["stages.0.0", "stages.1.0", "stages.2.0"]
    assert all(b.kind == "protocol" and b.last_norm is b.module.branch[-1] for b in sk)
    assert [b.depth for b in sk] == [0, 1, 2]
    bottlenecks = find_residual_blocks(get_model("resnet50", small_input=True))
    assert len(bottlenecks) == 16 and all(b.branch_end is b.module.bn3 for b in bottlenecks)
    assert find_residual_blocks(gpt()) == []


class LooksLikeABlock(nn.Module):
    """conv1/bn1/conv2/bn2 without the residual addition: must not be taken for a block."""

    def __init__(self):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4)
        self.conv2, self.bn2 = nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4)

    def forward(self, x):
        return F.relu(self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x))))))


def test_a_lookalike_without_the_addition_is_not_a_block():
    assert find_residual_blocks(nn.Sequential(LooksLikeABlock())) == []


def test_branch_scaling_and_skipping_follow_the_protocol():
    model = resnet8().eval()
    block = find_residual_blocks(model)[1]
    x = torch.randn(2, 32, 8, 8)
    full = block.module(x)
    block.scale_branch(0.0)
    assert torch.allclose(block.module(x), block.skipped_output(x))
    block.scale_branch(None)
    assert torch.allclose(block.module(x), full)


# ---------------------------------------------------------------------------------------------
# surgeries on every model they apply to

SURGERIES = {  # name -> (functional, kwargs) ; models where nothing matches must raise
    "blurpool": (apply_blurpool, {}),
    "squeeze_excite": (apply_squeeze_excite, {}),
    "stochastic_depth": (apply_stochastic_depth, {}),
    "ghost_batchnorm": (apply_ghost_batchnorm, {}),
    "weight_standardization": (apply_weight_standardization, {}),
    "factorize": (apply_factorization, {"min_channels": 32}),
    "low_precision_groupnorm": (apply_low_precision_groupnorm, {}),
    "low_precision_layernorm": (apply_low_precision_layernorm, {}),
    "identity_init": (apply_identity_init, {}),
    "gyro_dropout": (lambda m, **kw: apply_gyro_dropout(m, total_steps=100, **kw), {}),
    "patch_whitening": (lambda m, **kw: apply_patch_whitening(m, images_for(m, n=8), **kw), {}),
}
# (method, model) pairs where the model has nothing for the method: NothingToChangeError unless allow_empty
NOTHING = {("low_precision_groupnorm", m) for m in ("resnet18", "resnet8", "gpt")} | {
    ("low_precision_layernorm", "resnet18"), ("low_precision_layernorm", "resnet8"),
    ("gyro_dropout", "resnet18"), ("gyro_dropout", "resnet8"), ("gyro_dropout", "gpt")}  # GPT with dropout 0
VISION_ONLY = {"blurpool", "squeeze_excite", "stochastic_depth", "ghost_batchnorm", "weight_standardization",
               "identity_init", "patch_whitening"}
MODELS = {"resnet18": resnet18, "resnet8": resnet8, "gpt": gpt}


@pytest.mark.parametrize("model_name", list(MODELS))
@pytest.mark.parametrize("method", list(SURGERIES))
def test_surgery_reports_what_it_did_or_refuses_to_do_nothing(method, model_name):
    if model_name == "gpt" and method in VISION_ONLY:
        pytest.skip("vision method")
    assert REGISTRY[method].CARD.domain == ("vision" if method in VISION_ONLY else "any") or method.endswith(
        "groupnorm")
    fn, kwargs = SURGERIES[method]
    model = MODELS[model_name]()
    if (method, model_name) in NOTHING:
        with pytest.raises(NothingToChangeError, match=method):
            fn(model, **kwargs)
        assert fn(model, allow_empty=True, **kwargs).total == 0
        return
    report = fn(model, **kwargs)
    assert report.method == method and report.total > 0 and len(report.details) == report.total
    model.train()
    if model_name == "gpt":
        out = model(torch.randint(0, 256, (16, 8)))
        assert out.shape == (16, 8, 256)
    else:
        out = model(images_for(model))
        assert out.shape == (4, 10)
    out.float().sum().backward()  # the changed model still trains


@pytest.mark.parametrize("model_name", ["resnet18", "gpt"])
# patch_whitening whitens data on the model's device; identity_init and stochastic_depth read weight values,
# which a meta tensor has none of
@pytest.mark.parametrize("method", sorted(set(SURGERIES) - {"patch_whitening", "identity_init", "stochastic_depth"}))
def test_surgery_leaves_every_tensor_on_the_models_device(method, model_name):
    """Surgery runs after the model is on its device, so a layer it makes must be made there: a filter left on
    the CPU broke BlurPool on a GPU and on no CPU. The meta device stands in for a GPU."""
    if model_name == "gpt" and method in VISION_ONLY:
        pytest.skip("vision method")
    fn, kwargs = SURGERIES[method]
    model = MODELS[model_name]().to("meta")
    fn(model, allow_empty=True, **kwargs)
    off = [name for name, t in [*model.named_parameters(), *model.named_buffers()] if t.device.type != "meta"]
    assert not off, off


def test_gyro_dropout_and_low_precision_layernorm_on_a_gpt_with_dropout():
    model = gpt(dropout=0.1)
    assert apply_gyro_dropout(model, total_steps=100, sigma=8, tau=4).changed == {"dropouts": 5}
    assert apply_low_precision_layernorm(model).changed == {"layer norms": 5}
    model(torch.randint(0, 256, (8, 8))).sum().backward()


@pytest.mark.parametrize("name", sorted(SURGERIES))
def test_parameters_outside_the_card_raise(name):
    cls = REGISTRY[name]
    numeric = [hp for hp in cls.CARD.hparams if hp.type in (int, float) and hp.high is not None]
    for hp in numeric:
        with pytest.raises(ValueError, match=f"{name}.{hp.name}"):
            cls(**{hp.name: hp.high * 2 + 1})
    choices = [hp for hp in cls.CARD.hparams if hp.choices]
    for hp in choices:
        with pytest.raises(ValueError, match=f"{name}.{hp.name}"):
            cls(**{hp.name: "no-such-choice"})
    assert numeric or choices or name.startswith("low_precision")


# ---------------------------------------------------------------------------------------------
# each method does what it claims

def checkerboard(channels=16, size=16):
    board = (torch.arange(size)[:, None] + torch.arange(size)[None, :]) % 2 * 2.0 - 1.0
    return board.expand(1, channels, size, size).clone()


def high_frequency_energy(x):
    """Energy of the discrete Laplacian: large for pixel-to-pixel alternation, 0 for constants."""
    lap = 4 * x[..., 1:-1, 1:-1] - x[..., :-2, 1:-1] - x[..., 2:, 1:-1] - x[..., 1:-1, :-2] - x[..., 1:-1, 2:]
    return lap.pow(2).mean()


def test_blur_2d_removes_the_highest_frequency():
    board = checkerboard()
    blurred = blur_2d(board)
    assert blurred.shape == board.shape
    assert high_frequency_energy(blurred) < 1e-6 * high_frequency_energy(board)
    smooth = torch.ones_like(board)
    assert torch.allclose(blur_2d(smooth)[..., 1:-1, 1:-1], smooth[..., 1:-1, 1:-1])  # low-pass keeps DC
    assert blur_2d(board, stride=2).shape == (1, 16, 8, 8)


@pytest.mark.parametrize("stride", [2, 3, (2, 1)])
def test_the_sampled_blur_is_the_strided_depthwise_convolution_values_and_gradients(stride):
    """In bf16 on a CPU blur_2d samples the stride-1 blur and computes its gradient with a forward convolution
    (the fast kernel there): the same numbers as autograd's through the strided depthwise convolution, on odd
    sizes, keeping channels_last, under autocast too."""
    from speedkit.methods.blurpool import _SampledBlur, blur_filter

    torch.manual_seed(0)
    x = torch.randn(2, 3, 9, 8, dtype=torch.float64).to(memory_format=torch.channels_last).requires_grad_()
    filter = blur_filter(3, dtype=torch.float64)
    pair = (stride, stride) if isinstance(stride, int) else stride
    assert torch.autograd.gradcheck(lambda t: _SampledBlur.apply(t, filter, pair), (x,))

    def value_and_gradient(blur, inputs, autocast):
        leaf = inputs.detach().requires_grad_()
        with torch.autocast("cpu", torch.bfloat16, enabled=autocast):
            out = blur(leaf)
        (grad,) = torch.autograd.grad(out, leaf, torch.ones_like(out))
        return out, grad

    plain = lambda t: F.conv2d(t, filter.to(torch.bfloat16), stride=stride, padding=1, groups=3)  # noqa: E731
    for inputs, autocast in ((x.bfloat16(), False), (x.float(), True)):
        out, grad = value_and_gradient(lambda t: blur_2d(t, stride, filter.float()), inputs, autocast)
        expected_out, expected_grad = value_and_gradient(plain, inputs.bfloat16(), False)
        assert out.dtype == torch.bfloat16 and grad.dtype == inputs.dtype
        torch.testing.assert_close(out, expected_out)
        torch.testing.assert_close(grad, expected_grad.to(grad.dtype))
        assert out.is_contiguous(memory_format=torch.channels_last)
        assert grad.is_contiguous(memory_format=torch.channels_last)
    assert blur_2d(x.bfloat16(), stride).grad_fn.name().startswith("_SampledBlur")  # the path taken, not the conv


@pytest.mark.parametrize("stride", [1, 2, 3, (2, 1)])
def test_the_blur_by_shifts_is_the_depthwise_convolution_values_gradients_dtype_and_layout(stride):
    from speedkit.methods.blurpool import blur_by_shifts, blur_filter

    torch.manual_seed(0)
    pair = (stride, stride) if isinstance(stride, int) else stride
    x = torch.randn(2, 3, 9, 8, dtype=torch.float64).to(memory_format=torch.channels_last)
    for inputs in (x, x.contiguous()):
        shifted, convolved = inputs.clone().requires_grad_(), inputs.clone().requires_grad_()
        out = blur_by_shifts(shifted, pair)
        expected = F.conv2d(convolved, blur_filter(3, dtype=torch.float64), stride=stride, padding=1, groups=3)
        torch.testing.assert_close(out, expected)
        weights = torch.randn_like(out)
        torch.testing.assert_close(*torch.autograd.grad([(out * weights).sum(), (expected * weights).sum()],
                                                        [shifted, convolved]))
        assert out.is_contiguous(memory_format=torch.channels_last) == (inputs is x)
    with torch.autocast("cpu", torch.bfloat16):  # a convolution's dtype under autocast
        assert blur_by_shifts(x.float(), pair).dtype == torch.bfloat16


def test_a_compiled_blurpool_runs_no_convolution_for_its_blurs_and_gives_the_eager_numbers():
    from torch.profiler import profile

    torch.manual_seed(0)
    model = nn.Sequential(nn.BatchNorm2d(16), nn.ReLU(), nn.Conv2d(16, 8, 3, stride=2, padding=1),
                          nn.MaxPool2d(3, 2, 1))
    apply_blurpool(model)
    compiled = copy.deepcopy(model)
    compiled.compile()
    x = torch.randn(4, 16, 15, 14).to(memory_format=torch.channels_last)
    outputs, grads = [], []
    for net in (model, compiled):
        out = net(x)
        out.square().sum().backward()
        outputs.append(out)
        grads.append(net[2].weight.grad)
    torch.testing.assert_close(*outputs)
    torch.testing.assert_close(*grads)
    with profile() as prof:  # compiled already: a step's kernels
        compiled(x).square().sum().backward()
    names = [event.name for event in prof.events()]
    assert (names.count("aten::convolution"), names.count("aten::convolution_backward")) == (1, 1)  # the conv's own


@pytest.mark.parametrize("blur_first", [True, False])
def test_blurpool_keeps_shapes_and_stops_strided_convs_from_aliasing(blur_first):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(16, 8, 3, stride=2, padding=1), nn.MaxPool2d(3, 2, 1))
    plain = copy.deepcopy(model)
    report = apply_blurpool(model, blur_first=blur_first)
    assert report.changed == {"strided convs": 1, "max pools": 1}
    assert isinstance(model[0], BlurConv2d) and isinstance(model[1], MaxBlurPool2d)
    assert set(model.state_dict()) == set(plain.state_dict())
    for size in (15, 16, 17):
        x = torch.randn(2, 16, size, size)
        assert model(x).shape == plain(x).shape
        assert model[0](x).shape == plain[0](x).shape
    # the response to a checkerboard (all its energy above the output's Nyquist limit) is aliasing
    board, zeros = checkerboard(), torch.zeros(1, 16, 16, 16)
    with torch.no_grad():
        aliased = (plain[0](board) - plain[0](zeros))[..., 1:-1, 1:-1].pow(2).mean()
        blurred = (model[0](board) - model[0](zeros))[..., 1:-1, 1:-1].pow(2).mean()
    assert blurred < 0.01 * aliased


def test_blurpool_skips_narrow_inputs():
    model = nn.Sequential(nn.Conv2d(3, 16, 3, stride=2))
    with pytest.raises(NothingToChangeError, match="strided Conv2d"):
        apply_blurpool(model)
    assert apply_blurpool(model, min_channels=3).total == 1


def test_squeeze_excite_gates_channels_and_keeps_conv_keys():
    torch.manual_seed(0)
    conv = nn.Conv2d(4, 128, 3, padding=1)
    model = nn.Sequential(conv)
    apply_squeeze_excite(model, latent_channels=0.25)
    se_conv = model[0]
    assert isinstance(se_conv, SqueezeExciteConv2d) and se_conv.weight is conv.weight
    assert se_conv.se.squeeze.out_channels == 32
    x = torch.randn(2, 4, 6, 6)
    gate = model(x) / conv(x)  # one multiplier per (sample, channel), in (0, 1)
    assert torch.allclose(gate, gate[..., :1, :1].expand_as(gate), atol=1e-4)
    assert ((gate > 0) & (gate < 1)).all()
    assert {"0.weight", "0.bias"} <= set(model.state_dict())


def test_stochastic_depth_is_the_plain_block_in_eval_for_sample_mode():
    model = resnet18()
    reference = copy.deepcopy(model).eval()
    apply_stochastic_depth(model, drop_rate=0.5, mode="sample")
    model.eval()
    x = images_for(model)
    assert torch.equal(model(x), reference(x))


def test_stochastic_depth_block_mode_scales_by_survival_in_eval_and_skips_in_training():
    model = resnet8()
    apply_stochastic_depth(model, drop_rate=0.6, mode="block")
    layers = stochastic_depth_layers(model)
    assert [round(layer.drop_rate, 3) for layer in layers] == [0.2, 0.4, 0.6]  # linear in depth
    block = layers[2].block
    x = torch.randn(3, 64, 8, 8)
    model.eval()
    expected = F.relu(0.4 * block.module.branch(x) + block.module.shortcut(x))
    assert torch.allclose(block.module(x), expected, atol=1e-5)
    model.train()
    torch.manual_seed(0)
    skipped = 0
    for _ in range(40):
        out = block.module(x)
        skipped += torch.allclose(out, block.skipped_output(x))
    assert 12 <= skipped <= 36  # about 60% of 40


def test_stochastic_depth_sample_mode_drops_per_sample():
    model = resnet18()
    apply_stochastic_depth(model, drop_rate=0.5, mode="sample", drop_distribution="uniform")
    block = stochastic_depth_layers(model)[0].block
    block.module.train()
    x = torch.randn(64, 64, 4, 4)
    torch.manual_seed(0)
    out = block.module(x)
    dropped = torch.tensor([torch.allclose(o, s, atol=1e-5) for o, s in zip(out, block.skipped_output(x))])
    assert 16 <= int(dropped.sum()) <= 48  # some, not all, samples dropped in one batch


def test_ghost_batchnorm_normalises_virtual_batches_and_is_bn_in_eval():
    torch.manual_seed(0)
    model = nn.Sequential(nn.BatchNorm2d(3))
    plain = copy.deepcopy(model)
    keys = set(model.state_dict())
    apply_ghost_batchnorm(model, ghost_batch_size=4)
    assert set(model.state_dict()) == keys
    x = torch.randn(12, 3, 5, 5) + torch.arange(12.0)[:, None, None, None]  # chunks with different means
    out = model(x)
    per_chunk = torch.cat([F.batch_norm(c, None, None, training=True) for c in x.chunk(3)])
    assert torch.allclose(out, per_chunk, atol=1e-5)
    assert not torch.allclose(out, plain(x), atol=1e-3)
    # three updates with the adjusted momentum move the running mean like one ordinary update would
    assert torch.allclose(model[0].running_mean, plain[0].running_mean, atol=0.05)
    plain.load_state_dict(model.state_dict())  # same statistics: then eval mode is plain BatchNorm
    model.eval(), plain.eval()
    assert torch.equal(model(x), plain(x))


def test_weight_standardization_standardizes_and_leaves_the_last_layers():
    model = resnet8()
    report = apply_weight_standardization(model, n_last_layers_ignore=2)
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    assert report.total == len(convs) - 2
    w = convs[0].weight
    assert w.mean(dim=(1, 2, 3)).abs().max() < 1e-5
    assert torch.allclose(w.var(dim=(1, 2, 3), unbiased=False), torch.ones(w.shape[0]), atol=5e-3)
    assert not torch.nn.utils.parametrize.is_parametrized(convs[-1])
    assert "stem.0.parametrizations.weight.original" in model.state_dict()


def test_factorize_is_exact_at_full_rank_and_close_at_high_rank():
    torch.manual_seed(0)
    conv, linear = nn.Conv2d(8, 12, 3, stride=2, padding=1), nn.Linear(10, 7)
    x, v = torch.randn(2, 8, 9, 9), torch.randn(3, 10)
    assert torch.allclose(FactorizedConv2d(conv, 12)(x), conv(x), atol=1e-5)
    assert torch.allclose(FactorizedLinear(linear, 7)(v), linear(v), atol=1e-5)
    # a rank-4 weight is reproduced by rank 4
    low = nn.Linear(64, 64)
    with torch.no_grad():
        low.weight.copy_(torch.randn(64, 4) @ torch.randn(4, 64))
    assert torch.allclose(FactorizedLinear(low, 4)(v.repeat(1, 7)[:, :64]), low(v.repeat(1, 7)[:, :64]), atol=1e-3)


def test_factorize_only_where_it_saves_flops_and_never_splits_tied_weights():
    model = nn.Sequential(nn.Linear(256, 256), nn.Linear(256, 256))
    assert apply_factorization(model).changed == {"linears": 2}  # rank 64: 64*512 < 256*256
    with pytest.raises(NothingToChangeError):
        apply_factorization(nn.Sequential(nn.Linear(256, 256)), latent_fraction=0.6)  # 154*512 > 256*256
    language = gpt(n_embd=64)
    apply_factorization(language, min_channels=64)
    assert language.lm_head.weight is language.transformer.wte.weight


def gn_model():
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.GroupNorm(2, 8), nn.ReLU(), nn.Conv2d(8, 8, 1))


@pytest.mark.parametrize("kind", ["layernorm", "groupnorm"])
def test_low_precision_norms_match_fp32_and_run_in_bf16_under_autocast(kind):
    torch.manual_seed(0)
    if kind == "layernorm":
        model, x, apply = gpt(), torch.randint(0, 256, (2, 8)), apply_low_precision_layernorm
        norm_type = nn.LayerNorm
    else:
        model, x, apply = gn_model(), torch.randn(2, 3, 8, 8), apply_low_precision_groupnorm
        norm_type = nn.GroupNorm
    reference = copy.deepcopy(model)
    for m in model.modules():  # non-trivial affine parameters
        if isinstance(m, norm_type):
            nn.init.normal_(m.weight)
    reference.load_state_dict(model.state_dict())
    assert apply(model).total > 0
    assert torch.equal(model(x), reference(x))
    norm = next(m for m in model.modules() if isinstance(m, norm_type))
    norm_input = torch.randn(4, 8, 4, 4) if kind == "groupnorm" else torch.randn(4, 32)
    reference_norm = next(m for m in reference.modules() if isinstance(m, norm_type))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low, high = norm(norm_input), reference_norm(norm_input)
        assert low.dtype == torch.bfloat16 and high.dtype == torch.float32
        out, ref_out = model(x), reference(x)
    assert torch.allclose(low.float(), high, atol=0.05, rtol=0.02)
    assert torch.allclose(out.float(), ref_out.float(), atol=0.1, rtol=0.05)


def test_whitening_conv_decorrelates_patches():
    g = torch.Generator().manual_seed(0)
    images = F.avg_pool2d(torch.randn(64, 3, 12, 12, generator=g), 3, 1, 1) * 2 + 0.5  # correlated pixels
    conv = whitening_conv_from_images(images, kernel_size=2, eps=1e-6)
    assert conv.out_channels == 24 and not conv.weight.requires_grad
    out = conv(images).permute(0, 2, 3, 1).reshape(-1, 24)
    positive = out[:, :12]
    assert torch.allclose(torch.cov(positive.T), torch.eye(12), atol=1e-3)
    assert torch.allclose(out[:, 12:], -positive)
    raw = F.unfold(images, 2).transpose(1, 2).reshape(-1, 12)
    off_diagonal = torch.corrcoef(raw.T) - torch.eye(12)
    assert off_diagonal.abs().max() > 0.3  # the input patches were correlated


@pytest.mark.parametrize("factory", [resnet18, resnet8, lambda: get_model("resnet50")])
def test_patch_whitening_replaces_the_first_conv_and_keeps_shapes(factory):
    model = factory().eval()
    x = images_for(model, n=8, size=32)
    before = model(x)
    apply_patch_whitening(model, x)
    stem = next(m for m in model.modules() if isinstance(m, WhitenedConv2d))
    assert bool(stem.whitening_done) and not any(p.requires_grad for p in stem.whiten.parameters())
    assert model(x).shape == before.shape


def test_patch_whitening_adds_the_new_conv_to_an_optimizer_built_before():
    model = resnet8()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    apply_patch_whitening(model, torch.randn(8, 1, 28, 28))
    assert add_missing_parameters(optimizer, model) == 1  # the 1x1 conv's weight (bias-free like the stem)
    assert optimizer.param_groups[-1]["lr"] == 0.1 and optimizer.param_groups[-1]["momentum"] == 0.9
    assert add_missing_parameters(optimizer, model) == 0


def test_identity_init_makes_blocks_start_as_identities():
    model = resnet8()
    report = apply_identity_init(model)
    assert report.changed == {"dirac convs": 3, "zeroed branch norms": 3}
    model.eval()
    for block in find_residual_blocks(model):
        x = torch.randn(2, block.module.branch[0].in_channels, 8, 8)
        assert torch.allclose(block.module(x), F.relu(block.module.shortcut(x)))
    conv = model.stages[0][0].branch[3]  # 32 -> 32, 3x3: Dirac
    x = torch.randn(1, 32, 5, 5)
    assert torch.allclose(conv(x), x)


def test_gyro_dropout_uses_tau_masks_per_window_and_is_identity_in_eval():
    torch.manual_seed(0)
    layer = GyroDropoutLayer(0.5, sigma=8, tau=4, window=3)
    x = torch.ones(8, 32)
    first = layer(x)
    for rows in (slice(0, 2), slice(2, 4), slice(4, 6), slice(6, 8)):  # each sub-batch shares its mask
        assert torch.equal(first[rows][0], first[rows][1])
    assert len({tuple(r.tolist()) for r in first}) == 4
    assert set(first.unique().tolist()) <= {0.0, 2.0}
    assert torch.equal(layer(x), first) and torch.equal(layer(x), first)  # same window of 3 steps
    layer(x)
    masks = layer.masks.clone()
    assert torch.equal(masks, layer.masks) and layer.selected.shape == (4,)
    layer.eval()
    assert torch.equal(layer(x), x)


# ---------------------------------------------------------------------------------------------
# through the Trainer: each method acts at exactly the events its card declares

TRAINER_CASES = {  # name -> (setup factory, params, events expected in a 2-step run)
    "blurpool": (tiny_vision, {"min_channels": 4}, {Event.INIT: 1}),
    "squeeze_excite": (tiny_vision, {"min_channels": 8, "latent_channels": 0.5}, {Event.INIT: 1}),
    "stochastic_depth": (tiny_vision, {"drop_warmup": 0.5}, {Event.INIT: 1, Event.BATCH_START: 2}),
    "ghost_batchnorm": (tiny_vision, {"ghost_batch_size": 8}, {Event.INIT: 1}),
    "weight_standardization": (tiny_vision, {}, {Event.INIT: 1}),
    "factorize": (tiny_language, {"min_channels": 32}, {Event.INIT: 1}),
    "low_precision_groupnorm": (tiny_vision, {"allow_empty": True}, {Event.INIT: 1}),
    "low_precision_layernorm": (tiny_language, {}, {Event.INIT: 1}),
    "patch_whitening": (tiny_vision, {"num_samples": 32}, {Event.INIT: 1, Event.FIT_START: 1}),
    "identity_init": (tiny_vision, {}, {Event.INIT: 1}),
    "gyro_dropout": (lambda: tiny_language(dropout=0.1), {"sigma": 8, "tau": 2}, {Event.FIT_START: 1}),
}


@pytest.mark.parametrize("name", sorted(TRAINER_CASES))
def test_method_acts_at_its_card_events(name, tmp_path):
    setup, params, expected = TRAINER_CASES[name]
    method = REGISTRY[name](**params)
    trainer = run_steps(setup(), [method], steps=2, tmp_path=tmp_path)
    seen = trainer.engine.events_of(name)
    assert dict(seen) == expected
    assert set(seen) <= set(method.CARD.events)
    assert trainer.record.status == "completed"
    if Event.INIT in expected:
        assert any(note.startswith(name) for note in trainer.record.notes["surgery"])


def test_stochastic_depth_without_warmup_acts_only_at_init(tmp_path):
    trainer = run_steps(tiny_vision(), [REGISTRY["stochastic_depth"](mode="sample")], steps=2, tmp_path=tmp_path)
    assert dict(trainer.engine.events_of("stochastic_depth")) == {Event.INIT: 1}


def test_stochastic_depth_warmup_ramps_the_rate(tmp_path):
    trainer = run_steps(tiny_vision(), [REGISTRY["stochastic_depth"](drop_warmup=1.0)], steps=2, tmp_path=tmp_path)
    layers = stochastic_depth_layers(trainer.state.model)
    assert layers and all(layer.rate_scale == pytest.approx(0.5) for layer in layers)  # at batch 2 of 2: 1/2


def test_patch_whitening_in_the_trainer_trains_the_projection_not_the_whitening(tmp_path):
    trainer = run_steps(tiny_vision(), [REGISTRY["patch_whitening"]()], steps=2, tmp_path=tmp_path)
    stem = trainer.state.model.stem[0]
    assert isinstance(stem, WhitenedConv2d) and bool(stem.whitening_done)
    in_optimizer = {id(p) for group in trainer.state.optimizers[0].param_groups for p in group["params"]}
    assert id(stem.project.weight) in in_optimizer
    assert stem.whiten.weight.grad is None


def test_gyro_dropout_state_round_trips():
    method = REGISTRY["gyro_dropout"](sigma=8, tau=2)
    model = gpt(dropout=0.1)
    apply_gyro_dropout(model, total_steps=10, sigma=8, tau=2)
    method._load_layers(model)
    model.train()
    model(torch.randint(0, 256, (4, 8)))
    saved = method.state_dict()
    fresh, copy_model = REGISTRY["gyro_dropout"](sigma=8, tau=2), gpt(dropout=0.1)
    apply_gyro_dropout(copy_model, total_steps=10, sigma=8, tau=2)
    fresh.load_state_dict(saved)
    fresh._load_layers(copy_model)
    a = [m for m in model.modules() if isinstance(m, GyroDropoutLayer)]
    b = [m for m in copy_model.modules() if isinstance(m, GyroDropoutLayer)]
    assert all(torch.equal(x.masks, y.masks) and x.step == y.step for x, y in zip(a, b))


def test_weight_standardization_leaves_frozen_whitening_filters_alone():
    model = resnet8()
    apply_patch_whitening(model, torch.randn(8, 1, 28, 28))
    whiten = model.stem[0].whiten
    before = whiten.weight.clone()
    apply_weight_standardization(model)
    assert not torch.nn.utils.parametrize.is_parametrized(whiten)
    assert torch.nn.utils.parametrize.is_parametrized(model.stem[0].project)
    assert torch.equal(whiten.weight, before)


# -- the seed's ResNets: torchvision's and timm's ResNet-50 (issue 43) ----------------------------------------
def _torchvision_resnet50():
    import torchvision

    return torchvision.models.resnet50(weights=None)


def _timm_resnet50():
    timm = pytest.importorskip("timm")
    return timm.create_model("resnet50", pretrained=False)


# What each surgery must find in a ResNet-50 (3, 4, 6, 3 bottlenecks), from the architecture: blurpool the three
# stride-2 3x3 convs and three stride-2 1x1 shortcuts (the 3-channel stem is under min_channels) and the stem's
# max pool; squeeze-excite every conv with >= 128 output channels (4 + 13 + 19 + 10); stochastic depth the 16
# bottlenecks; ghost batchnorm the 53 batch norms; weight standardization the 53 convs.
RESNET50_FINDS = {
    "blurpool": (apply_blurpool, {}, 7),
    "squeeze_excite": (apply_squeeze_excite, {}, 46),
    "stochastic_depth": (apply_stochastic_depth, {}, 16),
    "ghost_batchnorm": (apply_ghost_batchnorm, {}, 53),
    "weight_standardization": (apply_weight_standardization, {}, 53),
    "factorize": (apply_factorization, {}, None),  # the convs and linears wide enough to factorize: some
}


@pytest.mark.parametrize("library", ["torchvision", "timm"])
@pytest.mark.parametrize("method", list(RESNET50_FINDS))
def test_surgeries_find_their_layers_in_torchvision_and_timm_resnet50(method, library):
    model = _torchvision_resnet50() if library == "torchvision" else _timm_resnet50()
    fn, kwargs, expected = RESNET50_FINDS[method]
    report = fn(model, **kwargs)
    assert report.total > 0, f"{method} found nothing in {library}'s ResNet-50"
    if expected is not None:
        assert report.total == expected, (method, library, report.changed)
    if method == "blurpool":
        assert report.changed == {"strided convs": 6, "max pools": 1}
    model.train()
    out = model(torch.randn(2, 3, 64, 64))
    assert out.shape == (2, 1000)
    out.sum().backward()  # the changed model still trains


def test_the_whole_hot_recipe_s_surgeries_stack_on_torchvision_resnet50():
    from speedkit.methods.channels_last import apply_channels_last

    model = _torchvision_resnet50()
    reports = [apply_blurpool(model), apply_stochastic_depth(model, drop_rate=0.1, mode="sample"),
               apply_squeeze_excite(model), apply_channels_last(model)]
    assert all(r.total > 0 for r in reports)
    assert len(stochastic_depth_layers(model)) == 16
    model.train()
    model(torch.randn(2, 3, 64, 64)).sum().backward()
