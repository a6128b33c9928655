"""Two ranks (torchrun, gloo) train one epoch through the Trainer on streamed image shards; each rank writes
the sample ids it was served, and rank 0 the losses. Used by tests/data/test_streaming_ranks.py."""
import json
import sys
from pathlib import Path

import torch
from helpers import leave_torchrun

from speedkit import Trainer
from speedkit.core import distributed
from speedkit.data.streaming import StreamingImageLoader

shards, out = Path(sys.argv[1]), Path(sys.argv[2])
loader = StreamingImageLoader(shards, 8, image_size=16, seed=1, num_workers=int(sys.argv[3]))
loader.seen_ids = []
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
                            torch.nn.Flatten(), torch.nn.Linear(4, 3))
trainer = Trainer(model, loader, max_duration="1ep", device="cpu", run_dir=out / "runs", run_name="ddp",
                  log_interval=1)
record = trainer.fit()
rank = distributed.rank()
val = StreamingImageLoader(shards, 8, split="val", image_size=16)  # evaluation: every sample once over the ranks
val.seen_ids = []
for _ in val:
    pass
(out / f"rank{rank}.json").write_text(json.dumps({"ids": loader.seen_ids, "batches": len(loader), "val": val.seen_ids,
                                                  "val_size": val.dataset_size,
                                                  "world": distributed.world_size(), "status": record.status,
                                                  "local_batch": loader.local_batch_size}))
leave_torchrun()
