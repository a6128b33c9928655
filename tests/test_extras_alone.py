"""Issue 41.6: every host extra, installed alone, runs what its README section shows. A clean venv per extra
would need the network; instead each runs in a Python that sees only the extra's declared dependency closure
(read from the installed packages' metadata): a folder of links to just those packages, on ``python -S``. A
dependency the extra forgot (``[hf]`` without accelerate, which TrainingArguments needs) is then simply not
there, as in a fresh ``pip install 'torch-speedkit[EXTRA]'``."""
from __future__ import annotations

import importlib.metadata as metadata
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

SHOWN = {  # extra -> what its README section does, at the smallest size
    "hf": """
import torch, transformers
from speedkit.hosts.hf import SpeedkitTrainer
from speedkit.methods import EMA, Muon
class Tokens(torch.utils.data.Dataset):
    def __len__(self): return 8
    def __getitem__(self, i):
        row = torch.arange(16) % 7
        return {"input_ids": row, "labels": row}
model = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=8, n_positions=16, bos_token_id=0, eos_token_id=0))
args = transformers.TrainingArguments(output_dir=OUT, max_steps=2, per_device_train_batch_size=4, report_to=[],
                                      use_cpu=True, save_strategy="no", disable_tqdm=True)
SpeedkitTrainer(model=model, args=args, train_dataset=Tokens(), methods=[EMA(), Muon()]).train()
""",
    "lightning": """
import torch, torch.nn.functional as F
import lightning.pytorch as L
from speedkit.hosts.lightning import SpeedkitCallback
from speedkit.methods import EMA, LabelSmoothing, Muon
class Classifier(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    def training_step(self, batch, batch_idx):
        batch = self.speedkit.batch(batch)
        return self.speedkit.loss(self.net(batch[0]), batch)
    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)
data = torch.utils.data.TensorDataset(torch.randn(16, 8), torch.randint(0, 2, (16,)))
L.Trainer(max_steps=2, accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
          callbacks=[SpeedkitCallback([EMA(), LabelSmoothing(0.1), Muon()])], default_root_dir=OUT).fit(
    Classifier(), torch.utils.data.DataLoader(data, batch_size=8))
""",
    "accelerate": """
import torch
from accelerate import Accelerator
from speedkit.hosts import Speedkit
from speedkit.methods import EMA, Muon
accelerator = Accelerator(cpu=True)
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(16, 8), torch.randint(0, 2, (16,))),
                                     batch_size=8)
model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
sk = Speedkit([EMA(), Muon()], max_duration="2ba", train_dataloader=loader, accelerator=accelerator)
model = sk.prepare_model(model)
optimizer = sk.prepare_optimizer(torch.optim.AdamW(model.parameters()))
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
for batch in loader:
    batch = sk.batch(batch)
    sk.backward(sk.loss(model(batch[0]), batch))
    optimizer.step(); optimizer.zero_grad(); sk.step_end()
sk.finish()
""",
}


def extras() -> dict[str, list[str]]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]


def closure(extra: str) -> set[str]:
    """The distributions ``pip install 'torch-speedkit[extra]'`` brings: the base dependencies, the extra's,
    and theirs, recursively, with the extras each requirement names (markers evaluated here)."""
    from packaging.requirements import Requirement

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = [Requirement(r) for r in project["dependencies"] + extras()[extra]]
    seen: set[str] = set()
    while wanted:
        requirement = wanted.pop()
        name = requirement.name.lower().replace("_", "-")
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue
        if name == "torch-speedkit":
            wanted += [Requirement(r) for e in requirement.extras for r in extras()[e]]
            continue
        key = (name, tuple(sorted(requirement.extras)))
        if key in seen:
            continue
        seen.add(key)
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            pytest.skip(f"{name} (needed by [{extra}]) is not installed: pip install 'torch-speedkit[{extra}]'")
        for line in requires:
            sub = Requirement(line)
            if sub.marker is None or any(sub.marker.evaluate({"extra": e}) for e in ("", *requirement.extras)):
                wanted.append(sub)
    return {name for name, _ in seen}


def only(distributions: set[str], folder: Path) -> Path:
    """A folder holding links to just ``distributions``' files (top-level packages, modules, dist-info)."""
    folder.mkdir()
    for dist in metadata.distributions():
        name = dist.metadata["Name"].lower().replace("_", "-")
        if name not in distributions:
            continue
        base = Path(dist.locate_file(""))
        for top in {Path(f).parts[0] for f in dist.files or ()}:
            source, target = base / top, folder / top
            if top not in ("..", "__pycache__") and source.exists() and not target.exists():
                target.symlink_to(source)
    return folder


@pytest.mark.slow
@pytest.mark.parametrize("extra", sorted(SHOWN))
def test_each_host_extra_alone_runs_what_its_section_shows(extra, tmp_path):
    assert extra in extras()
    site = only(closure(extra), tmp_path / "site")
    script = f"OUT = {str(tmp_path / 'out')!r}\n" + SHOWN[extra]
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{site}", "OMP_NUM_THREADS": "1",
           "TRANSFORMERS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-S", "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"[{extra}] alone:\n{done.stderr[-3000:]}"


def test_the_hf_extra_declares_what_its_trainer_needs():
    names = {r.split(">")[0].split("[")[0].split("=")[0].strip() for r in extras()["hf"]}
    assert {"transformers", "accelerate"} <= names  # TrainingArguments needs accelerate
