"""Tiny tasks for testing methods quickly: a small image problem and a small byte-level LM problem.

Both are learnable (so a method that breaks training shows), run in well under a second per step,
and go through the real Trainer and the real loaders.
"""
from __future__ import annotations

import torch

from speedkit import Trainer
from speedkit.data import Augment, BatchLoader, TokenBatchLoader
from speedkit.models.gpt import GPT, GPTConfig
from speedkit.models.resnet import SmallResNet


def tiny_images(n: int = 64, size: int = 16, channels: int = 1, classes: int = 4, seed: int = 0):
    """uint8 images [N, C, H, W] whose class is a bright quadrant, plus noise; labels [N]."""
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % classes
    x = torch.randint(0, 60, (n, channels, size, size), generator=g, dtype=torch.uint8)
    half = size // 2
    for i, label in enumerate(y.tolist()):
        r, c = divmod(label % 4, 2)
        x[i, :, r * half:(r + 1) * half, c * half:(c + 1) * half] += 150
    return x, y


def tiny_vision(batch_size: int = 16, n: int = 64, size: int = 16, channels: int = 1, classes: int = 4,
                augment: Augment | None = Augment(crop_pad=1, flip="random"), seed: int = 0):
    """(model, train loader, eval loader): a two-stage ResNet on ``tiny_images``."""
    x, y = tiny_images(n, size, channels, classes, seed)
    train = BatchLoader(x, y, batch_size, augment=augment, mean=0.3, std=0.3, seed=seed)
    test = BatchLoader(x, y, 32, shuffle=False, mean=0.3, std=0.3)
    torch.manual_seed(seed)
    model = SmallResNet([8, 16], [1, 1], num_classes=classes, in_channels=channels)
    return model, train, test


def tiny_language(batch_size: int = 4, seq_len: int = 16, n_tokens: int = 4096, seed: int = 0, **config):
    """(model, train loader, eval loader): a 2-layer GPT on a repetitive byte stream."""
    g = torch.Generator().manual_seed(seed)
    pattern = torch.randint(0, 256, (37,), generator=g, dtype=torch.uint8)
    data = pattern.repeat(n_tokens // 37 + 1)[:n_tokens]
    train = TokenBatchLoader(data, seq_len, batch_size, steps_per_epoch=8, seed=seed)
    test = TokenBatchLoader(data, seq_len, 8, steps_per_epoch=2, shuffle=False)
    torch.manual_seed(seed)
    cfg = dict(vocab_size=256, block_size=seq_len, n_layer=2, n_head=2, n_embd=32)
    cfg.update(config)
    return GPT(GPTConfig(**cfg)), train, test


def run_steps(setup, methods=(), steps: int = 2, tmp_path=None, **trainer_kwargs) -> Trainer:
    """Train ``steps`` batches of a (model, train, eval) setup with ``methods``; returns the Trainer."""
    model, train, test = setup
    options = dict(max_duration=f"{steps}ba", device="cpu", run_dir=tmp_path or "runs/tests",
                   save_checkpoints=False, log_interval=1, eval_interval=f"{steps}ba",
                   optimizers=lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9))
    options.update(trainer_kwargs)
    trainer = Trainer(model, train, eval_dataloader=test, methods=list(methods), **options)
    trainer.fit()
    return trainer
