"""Tests for speedkit.models: shapes, the residual-block protocol, GPT causality and positions, init
loss, that a few steps learn, preset sizes, and the registry's errors. Whole file: ~15 s on 2 CPU cores."""

import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from speedkit.models import (GPT, GPT_CONFIGS, MODELS, BasicBlock, GPTConfig, Rotary, UNet,
                             get_model, gpt_config, list_models)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


# ---------------------------------------------------------------------------------------------
# every registered model builds and has the right output shape

VISION_INPUTS = {  # name -> (input shape, output shape), with get_model's default num_classes=10
    "resnet8": ((2, 1, 28, 28), (2, 10)),
    "resnet9": ((2, 1, 28, 28), (2, 10)),
    "resnet20": ((2, 3, 32, 32), (2, 10)),
    "resnet56": ((2, 3, 32, 32), (2, 10)),
    "resnet18": ((2, 3, 32, 32), (2, 10)),
    "resnet50": ((2, 3, 32, 32), (2, 10)),
    "resnet101": ((2, 3, 32, 32), (2, 10)),
    "unet": ((2, 1, 16, 16), (2, 10, 16, 16)),
}


def test_registry_covers_the_promised_names():
    expected = {"resnet8", "resnet9", "resnet20", "resnet56", "resnet18", "resnet50", "resnet101", "unet",
                *GPT_CONFIGS}
    assert set(list_models()) == expected == set(MODELS)
    assert {"gpt-nano", "gpt-micro", "gpt-mini", "gpt-small", "gpt2-124m"} <= set(GPT_CONFIGS)


@pytest.mark.parametrize("name", list(VISION_INPUTS))
def test_vision_output_shapes(name):
    in_shape, out_shape = VISION_INPUTS[name]
    model = get_model(name).eval()
    with torch.no_grad():
        assert model(torch.randn(in_shape)).shape == out_shape


@pytest.mark.parametrize("name", list(GPT_CONFIGS))
def test_gpt_output_shapes(name):
    # built on the meta device: shapes propagate without allocating or initialising 124M weights
    with torch.device("meta"):
        model = get_model(name)
        idx = torch.zeros(2, 8, dtype=torch.long)
        logits = model(idx)
    assert logits.shape == (2, 8, model.config.padded_vocab_size)  # rows past vocab_size: padding


def test_gpt_real_forward_shape_and_block_size_limit():
    model = get_model("gpt-nano", block_size=16)
    assert model(torch.randint(0, 256, (3, 16))).shape == (3, 16, 256)
    with pytest.raises(ValueError, match="block_size"):
        model(torch.randint(0, 256, (1, 17)))


def test_num_classes_and_in_channels_are_passed_through():
    model = get_model("resnet20", num_classes=100, in_channels=1).eval()
    assert model(torch.randn(2, 1, 32, 32)).shape == (2, 100)
    model = get_model("resnet9", num_classes=7, in_channels=3, width=8).eval()
    assert model(torch.randn(2, 3, 28, 28)).shape == (2, 7)


def test_torchvision_resnet_small_input_adaptation():
    model = get_model("resnet18", in_channels=1, small_input=True).eval()
    assert model.conv1.in_channels == 1
    assert model.conv1.kernel_size == (3, 3) and model.conv1.stride == (1, 1)
    assert isinstance(model.maxpool, nn.Identity)
    assert model(torch.randn(2, 1, 28, 28)).shape == (2, 10)
    # without small_input only the channel count changes: the ImageNet stem stays
    model = get_model("resnet18", in_channels=1)
    assert model.conv1.in_channels == 1 and model.conv1.stride == (2, 2)
    assert isinstance(model.maxpool, nn.MaxPool2d)


def test_unknown_model_name_lists_known_names():
    with pytest.raises(ValueError) as err:
        get_model("resnet1000")
    message = str(err.value)
    assert "resnet1000" in message
    for name in list_models():
        assert name in message


# ---------------------------------------------------------------------------------------------
# the residual-block protocol that surgery methods rely on

def _blocks(model):
    return [m for m in model.modules() if isinstance(m, BasicBlock)]


@pytest.mark.parametrize("name,in_shape,n_blocks", [
    ("resnet8", (4, 1, 28, 28), 3), ("resnet9", (4, 1, 28, 28), 2), ("resnet20", (4, 3, 32, 32), 9),
])
def test_resnet_blocks_follow_the_protocol(name, in_shape, n_blocks):
    model = get_model(name).eval()
    blocks = _blocks(model)
    assert len(blocks) == n_blocks
    inputs = {}
    for b in blocks:
        b.register_forward_pre_hook(lambda mod, args: inputs.__setitem__(mod, args[0]))
        assert isinstance(b.branch, nn.Sequential) and isinstance(b.branch[-1], nn.BatchNorm2d)
        assert isinstance(b.shortcut, (nn.Identity, nn.Sequential))
    with torch.no_grad():
        model(torch.randn(in_shape))
        for b in blocks:
            x = inputs[b]
            out = b(x)
            torch.testing.assert_close(out, F.relu(b.branch(x) + b.shortcut(x)))
            # a projection shortcut exactly where the shape changes
            assert isinstance(b.shortcut, nn.Identity) == (out.shape == x.shape)


def test_zeroing_last_branch_bn_makes_block_identity_like():
    # what identity init will do: with the branch's last BN scale and shift at zero, out = relu(shortcut(x))
    block = BasicBlock(8, 8).eval()
    nn.init.zeros_(block.branch[-1].weight)
    nn.init.zeros_(block.branch[-1].bias)
    x = torch.randn(2, 8, 6, 6).relu()
    torch.testing.assert_close(block(x), x)


def test_convs_have_kaiming_init():
    conv = get_model("resnet56").stages[2][0].branch[3]  # a 64->64 3x3 conv
    fan_out = conv.out_channels * 9
    assert conv.weight.std().item() == pytest.approx(math.sqrt(2 / fan_out), rel=0.1)


# ---------------------------------------------------------------------------------------------
# GPT: causality, positions, init loss

def _tiny_gpt(**kw):
    cfg = dict(vocab_size=256, block_size=32, n_layer=2, n_head=2, n_embd=32)
    cfg.update(kw)
    return GPT(GPTConfig(**cfg)).eval()


@pytest.mark.parametrize("positions", ["learned", "rotary"])
@pytest.mark.parametrize("activation", ["gelu", "relu2"])
def test_gpt_is_causal(positions, activation):
    model = _tiny_gpt(positions=positions, activation=activation)
    idx = torch.randint(0, 256, (2, 20))
    t = 11
    changed = idx.clone()
    changed[:, t] = (changed[:, t] + 1) % 256
    with torch.no_grad():
        a, b = model(idx), model(changed)
    torch.testing.assert_close(a[:, :t], b[:, :t])           # the past can't see the future
    assert (a[:, t:] - b[:, t:]).abs().amax(-1).min() > 1e-6  # every later position does see it


def test_rotary_changes_logits_only_through_positions():
    rotary = _tiny_gpt(positions="rotary")
    learned = _tiny_gpt(positions="learned")
    assert "wpe" not in rotary.transformer and "wpe" in learned.transformer
    # give the learned model the rotary model's weights and zero position embeddings: the only
    # difference left between the two is the rotation of q and k
    missing, unexpected = learned.load_state_dict(rotary.state_dict(), strict=False)
    assert missing == ["transformer.wpe.weight"] and unexpected == []
    nn.init.zeros_(learned.transformer.wpe.weight)
    idx = torch.randint(0, 256, (2, 24))
    with torch.no_grad():
        with_rotary = rotary(idx)
        without = learned(idx)
        assert (with_rotary - without).abs().max() > 1e-3
        for block in rotary.transformer.h:  # switch rotation off: now the two agree
            block.attn.rotary = None
        torch.testing.assert_close(rotary(idx), without)


def test_rotary_scores_depend_only_on_relative_position():
    rot = Rotary(head_dim=8, max_len=32)
    q, k = torch.randn(8), torch.randn(8)

    def score(m, n):  # place q at position m and k at position n, rotate, dot
        qs = torch.zeros(1, 1, 32, 8); ks = torch.zeros(1, 1, 32, 8)
        qs[0, 0, m] = q; ks[0, 0, n] = k
        return (rot(qs)[0, 0, m] * rot(ks)[0, 0, n]).sum()

    assert score(5, 2) == pytest.approx(score(20, 17).item(), abs=1e-5)
    assert score(5, 2) != pytest.approx(score(5, 4).item(), abs=1e-3)
    # a rotation: norms are kept
    x = torch.randn(1, 2, 32, 8)
    torch.testing.assert_close(rot(x).norm(dim=-1), x.norm(dim=-1))


def test_gpt_init_loss_is_near_uniform():
    model = get_model("gpt-nano").eval()
    idx = torch.randint(0, 256, (4, 128))
    targets = torch.randint(0, 256, (4, 128))
    with torch.no_grad():
        loss = model.loss(model(idx), (idx, targets))
    assert loss.item() == pytest.approx(math.log(256), abs=0.1)


def test_gpt_runs_under_bf16_autocast_with_rotary():
    # rotary's cos/sin are fp32 buffers; they must follow q/k into bf16 or SDPA rejects mixed dtypes
    model = _tiny_gpt(positions="rotary")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(torch.randint(0, 256, (2, 16)))
    assert logits.shape == (2, 16, 256) and torch.isfinite(logits.float()).all()


def test_cpu_bf16_attention_runs_in_fp32_and_comes_back_in_bf16_with_the_attention_methods_too():
    """On a CPU the bf16 SDPA kernel is the slower one, so the GPT computes attention in fp32 there; the
    rest of the block stays bf16, and rotary and QK-norm (which intercept the SDPA call) see fp32 q and k."""
    from torch.overrides import TorchFunctionMode

    from speedkit.methods.qk_norm import apply_qk_norm
    from speedkit.methods.rotary_embeddings import apply_rotary_embeddings

    class SeenDtypes(TorchFunctionMode):
        def __init__(self):
            super().__init__()
            self.dtypes = []

        def __torch_function__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func is F.scaled_dot_product_attention:
                self.dtypes.append((args[0].dtype, out.dtype))
            return out

    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=16, n_layer=2, n_head=2, n_embd=32))
    idx = torch.randint(0, 256, (2, 16))
    apply_rotary_embeddings(model)
    apply_qk_norm(model)
    with SeenDtypes() as seen, torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(idx)
    assert seen.dtypes == [(torch.float32, torch.float32)] * 2  # one SDPA call per layer, in fp32
    assert logits.dtype == torch.bfloat16 and torch.isfinite(logits).all()
    attn = model.transformer.h[0].attn
    q, k, v = (torch.randn(2, 2, 16, 16, dtype=torch.bfloat16) for _ in range(3))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = attn._attend(q, k, v)
    exact = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
    assert out.dtype == torch.bfloat16 and torch.equal(out, exact.to(torch.bfloat16))


def test_gpt_tied_and_untied_head():
    tied = _tiny_gpt()
    assert tied.lm_head.weight is tied.transformer.wte.weight
    untied = _tiny_gpt(tie_weights=False)
    assert untied.lm_head.weight is not untied.transformer.wte.weight
    assert untied.num_params() == tied.num_params() + 256 * 32


def test_residual_projections_have_scaled_init():
    model = get_model("gpt-mini")  # 6 layers: std 0.02 / sqrt(12)
    proj = model.transformer.h[0].mlp.proj.weight
    fc = model.transformer.h[0].mlp.fc.weight
    assert proj.std().item() == pytest.approx(0.02 / math.sqrt(12), rel=0.05)
    assert fc.std().item() == pytest.approx(0.02, rel=0.05)


# ---------------------------------------------------------------------------------------------
# a few steps on one fixed batch lower the loss

def test_gpt_learns_a_fixed_batch():
    model = _tiny_gpt(positions="rotary").train()
    idx = torch.randint(0, 256, (4, 32))
    batch = (idx, torch.roll(idx, -1, dims=1))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(15):
        loss = model.loss(model(batch[0]), batch)
        opt.zero_grad(); loss.backward(); opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 1.0


@pytest.mark.parametrize("name", ["resnet8", "resnet9"])
def test_resnet_learns_a_fixed_batch(name):
    model = get_model(name).train()
    x, y = torch.randn(32, 1, 28, 28), torch.randint(0, 10, (32,))
    opt = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9, nesterov=True)
    losses = []
    for _ in range(15):
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad(); loss.backward(); opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]


def test_resnet8_channels_last_bf16_matches_fp32():
    model = get_model("resnet8").eval()
    x = torch.randn(4, 1, 28, 28)
    with torch.no_grad():
        ref = model(x)
        model = model.to(memory_format=torch.channels_last)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(x.to(memory_format=torch.channels_last))
    torch.testing.assert_close(out.float(), ref, atol=0.1, rtol=0.1)


# ---------------------------------------------------------------------------------------------
# preset sizes

GPT_RANGES = {  # name -> (low, high) total parameters with the preset's own vocabulary
    "gpt-nano": (0.7e6, 1.5e6),
    "gpt-micro": (2.0e6, 4.0e6),
    "gpt-mini": (8e6, 13e6),
    "gpt-small": (25e6, 38e6),
    "gpt2-124m": (123.5e6, 125.5e6),
}


@pytest.mark.parametrize("name", list(GPT_RANGES))
def test_gpt_preset_sizes(name):
    with torch.device("meta"):  # no memory, no init: building GPT-2 124M this way costs milliseconds
        model = get_model(name)
    low, high = GPT_RANGES[name]
    assert low <= model.num_params() <= high
    assert model.config.vocab_size == (50257 if name == "gpt2-124m" else 256)


def test_gpt2_124m_exact_count_and_flops():
    with torch.device("meta"):
        model = GPT(gpt_config("gpt2-124m"))
    assert model.num_params() == 124_439_808  # GPT-2 small as released (tied head, biases)
    n_body = model.num_params(non_embedding=True)
    assert n_body == 124_439_808 - 50257 * 768 - 1024 * 768
    # 6N over the matmul weights (body + head) plus the attention term at T = 1024
    assert model.flops_per_token() == 6 * (n_body + 50257 * 768) + 12 * 12 * 768 * 1024
    assert model.flops_per_token(seq_len=256) < model.flops_per_token()


def test_gpt_config_validates():
    with pytest.raises(ValueError):
        GPTConfig(n_embd=30, n_head=4)
    with pytest.raises(ValueError):
        GPTConfig(positions="alibi")
    with pytest.raises(ValueError, match="gpt-nano"):
        gpt_config("gpt-huge")


def test_small_resnet_sizes():
    count = lambda m: sum(p.numel() for p in m.parameters())
    assert 0.26e6 < count(get_model("resnet20")) < 0.30e6   # He et al.: 0.27M
    assert 0.84e6 < count(get_model("resnet56")) < 0.90e6   # He et al.: 0.85M
    assert count(get_model("resnet8")) < count(get_model("resnet9"))


# ---------------------------------------------------------------------------------------------
# UNet

@pytest.mark.parametrize("depth,size", [(3, 32), (2, 20), (4, 48)])
def test_unet_output_shape(depth, size):
    model = UNet(in_channels=3, num_classes=5, base=8, depth=depth).eval()
    with torch.no_grad():
        assert model(torch.randn(2, 3, size, size + 2 ** depth)).shape == (2, 5, size, size + 2 ** depth)


def test_unet_rejects_indivisible_sizes():
    with pytest.raises(ValueError, match="divisible"):
        UNet(depth=3)(torch.randn(1, 1, 20, 20))
