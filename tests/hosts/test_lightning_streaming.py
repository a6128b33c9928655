"""Streamed shards in Lightning: a run killed mid-epoch and resumed from Lightning's checkpoint (which carries the
loader's state: the streaming loaders are stateful) serves the rest of the epoch, each sample once, and ends with
the weights of an uninterrupted run."""
from __future__ import annotations

import pytest
import torch
from prerequisites import import_or_missing

L = import_or_missing("lightning.pytorch", "pip install 'torch-speedkit[lightning]'")
pytest.importorskip("litdata")

from streaming_data import make_image_folder  # noqa: E402

from speedkit.data.streaming import StreamingImageLoader, prepare_images  # noqa: E402

QUIET = dict(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False, enable_model_summary=False,
             num_sanity_val_steps=0)


class Classifier(L.LightningModule):
    def __init__(self, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
                                       torch.nn.Flatten(), torch.nn.Linear(4, 3))

    def training_step(self, batch, batch_idx):
        images, labels = batch
        return torch.nn.functional.cross_entropy(self.net(images), labels)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class Kill(L.Callback):
    def __init__(self, step):
        self.step = step

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        if trainer.global_step == self.step:
            raise RuntimeError("killed")


def test_a_streamed_run_killed_mid_epoch_resumes_exactly_from_lightnings_checkpoint(tmp_path):
    source = make_image_folder(tmp_path / "source", per_class=11)
    prepare_images(source, tmp_path / "shards", short_side=24, progress=False)

    def loader():
        made = StreamingImageLoader(tmp_path / "shards", 4, image_size=16)
        made.seen_ids = []
        return made

    whole, whole_loader = Classifier(), loader()
    L.Trainer(max_epochs=2, enable_checkpointing=False, **QUIET).fit(whole, whole_loader)
    per_epoch = len(whole_loader)
    saver = L.callbacks.ModelCheckpoint(dirpath=tmp_path / "ckpt", save_top_k=-1, every_n_train_steps=1)
    killed_loader = loader()
    with pytest.raises(RuntimeError, match="killed"):
        L.Trainer(max_epochs=2, callbacks=[saver, Kill(per_epoch + 2)], **QUIET).fit(Classifier(), killed_loader)
    checkpoint = tmp_path / "ckpt" / f"epoch=1-step={per_epoch + 2}.ckpt"
    resumed, resumed_loader = Classifier(seed=1), loader()
    L.Trainer(max_epochs=2, enable_checkpointing=False, **QUIET).fit(resumed, resumed_loader, ckpt_path=checkpoint)

    epoch_size = whole_loader.dataset_size
    assert len(resumed_loader.seen_ids) == epoch_size - 2 * 4  # the rest of epoch 1, no sample twice
    before = killed_loader.seen_ids[:2 * epoch_size - len(resumed_loader.seen_ids)]
    assert before + resumed_loader.seen_ids == whole_loader.seen_ids
    for (name, ours), theirs in zip(resumed.state_dict().items(), whole.state_dict().values()):
        assert torch.allclose(ours, theirs, atol=1e-6), name
