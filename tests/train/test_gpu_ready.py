"""GPU-ready, proven on a CPU (issue 54, DESIGN.md principle 8): what a GPU pays for, counted here.

- the augmentations draw their randomness on the device: a quiet step neither reads the device nor copies host
  data to it (``SyncCounter`` counts both), for each method alone and for every preset of the seed's ``imagenet``
  and ``gpt2`` tasks at their cpu rehearsal (``fashion-mnist`` and ``pydocs``: tests/callbacks/test_sync_counter.py);
- a run sees few input shapes (progressive resizing in 32-px buckets, sequence-length warmup in steps of at least
  64 tokens), within a stated budget at the published sizes and in a whole (short) run, and a compiled model
  compiles no more graphs than the shapes it sees, none for a partial last batch (the Trainer runs it eager);
- every seed preset's model traces with no graph break, and GPT's compiled loss makes no fp32 copy of the logits;
- the ``gpu`` sizes compile the model, and cuDNN's autotuner is on where the device is CUDA.
"""
from __future__ import annotations

import random

import pytest
import torch
from torch.utils._python_dispatch import is_in_torch_dispatch_mode
from method_harness import run_steps, tiny_vision
from prerequisites import require

from speedkit.callbacks import Callback, SyncCounter
from speedkit.core.batch import batch_inputs
from speedkit.methods import ColOut, CutMix, CutOut, MixUp, ProgressiveResizing, RandAugment
from speedkit.methods.colout import colout_batch
from speedkit.methods.progressive_resizing import progressive_scale, scaled_size
from speedkit.methods.seq_length_warmup import SeqLengthWarmup, seq_length_at
from speedkit.methods.stochastic_depth import apply_stochastic_depth
from speedkit.tasks import TASKS, make_trainer
from speedkit.tasks.recipes import load_presets
from speedkit.tasks.task import BUILT_IN

# The stated budgets: distinct training input sizes (image side or sequence length) in a whole run.
IMAGE_SIZES_PER_RUN = 6  # progressive resizing's 32-px steps from half the published 176-224 px to full
TOKENS_STEP = 64  # sequence-length warmup's shortest step: 1 + 1024 / 64 = 17 lengths at GPT-2's context


def _seed_data(tmp_path_factory):
    pytest.importorskip("litdata")
    pytest.importorskip("tokenizers")
    from streaming_data import make_image_folder

    root = tmp_path_factory.mktemp("seed-data")
    make_image_folder(root / "imagenet" / "train", per_class=5, seed=0)
    make_image_folder(root / "imagenet" / "val", per_class=2, seed=1)
    corpus = root / "corpus"
    corpus.mkdir()
    rng = random.Random(0)
    words = ["the", "seed", "trains", "a", "model", "on", "tokens", "from", "shards", "of", "text", "and", "images"]
    for i in range(8):
        (corpus / f"doc{i}.txt").write_text(" ".join(rng.choice(words) for _ in range(1500)) + "\n")
    return {"imagenet": root / "imagenet", "gpt2": corpus, "cache": root / "cache"}


@pytest.fixture(scope="module")
def seed_data(tmp_path_factory):
    return _seed_data(tmp_path_factory)


@pytest.fixture
def shard_cache(seed_data, monkeypatch):
    monkeypatch.setenv("SPEEDKIT_SHARDS", str(seed_data["cache"]))


def _task_options(task: str, seed_data=None, **options) -> dict:
    """make_trainer's keywords for a small run of ``task`` on a CPU: the seed tasks at their cpu rehearsal."""
    if task in ("imagenet", "gpt2"):
        return dict(data=str(seed_data[task]), task_options={"sizes": "cpu", **options})
    require("fashion-mnist" if task == "fashion-mnist" else "python-docs")
    return dict(data_fraction=0.01, eval_fraction=0.005)


SEED_PRESETS = [(task, name) for task in ("imagenet", "gpt2") for name in load_presets(task)]
ALL_PRESETS = [(task, name) for task in sorted(BUILT_IN) for name in TASKS[task].recipes] + SEED_PRESETS


# ------------------------------------------------------------------------- no host wait, no blocking copy

@pytest.mark.parametrize("method", [RandAugment(), RandAugment(num_ops=3, magnitude=30), ColOut(), CutOut(),
                                    MixUp(), CutMix()], ids=lambda m: f"{m.name}{m.params.get('num_ops', '')}")
def test_an_augmenting_step_neither_waits_nor_copies_from_the_host(tmp_path, method):
    counter = SyncCounter(keep_stacks=True)
    run_steps(tiny_vision(channels=3), [method], steps=6, tmp_path=tmp_path, log_interval=3, eval_interval="6ba",
              callbacks=[counter])
    quiet = counter.quiet_steps()
    assert set(quiet) == {2, 4, 5}, counter.report()
    where = "\n".join(stack for (phase, stack) in counter.stacks if phase[1] in quiet)
    assert sum(quiet.values()) == 0, f"{dict(counter.totals)} in quiet steps {quiet}:\n{where}"


@pytest.mark.parametrize("task, name", SEED_PRESETS, ids=[f"{t}:{n}" for t, n in SEED_PRESETS])
def test_quiet_steps_of_the_seed_presets_neither_wait_nor_copy(tmp_path, seed_data, shard_cache, task, name):
    counter = SyncCounter(keep_stacks=True)
    trainer = make_trainer(task, name, duration="7ba", batch_size=4, eval_interval="3ba", log_interval=3,
                           device="cpu", run_dir=tmp_path, save_checkpoints=False, callbacks=[counter],
                           **_task_options(task, seed_data))
    assert trainer.fit().status == "completed"
    quiet = counter.quiet_steps()
    assert set(quiet) == {2, 4, 5}, counter.report()
    where = "\n".join(stack for (phase, stack) in counter.stacks if phase[1] in quiet)
    assert sum(quiet.values()) == 0, f"{dict(counter.totals)} in quiet steps {quiet}:\n{where}"


# ------------------------------------------------------------------------------------ shapes per run

def _published(task: str):
    from speedkit.tasks.builtin.gpt2 import gpt2_recipes
    from speedkit.tasks.builtin.imagenet import image_sizes, imagenet_recipes

    if task == "imagenet":
        return {name: (recipe, image_sizes(recipe, "gpu")[0]) for name, recipe in imagenet_recipes("gpu").items()}
    return {name: (recipe, 1024) for name, recipe in gpt2_recipes("gpu").items()}


def _image_sizes_over_a_run(recipe, full: int) -> set[int]:
    """Every training image side a whole run of ``recipe`` at ``full`` px gives the model (its progressive
    resizing's schedule at every thousandth of the run, then its ColOut), through the methods' own functions."""
    params = ProgressiveResizing(**recipe.methods.get("progressive_resizing", {})).params
    sides = set()
    for step in range(1001):
        side = full
        if "progressive_resizing" in recipe.methods:
            scale = progressive_scale(step / 1000, params["initial_scale"], params["finetune_fraction"],
                                      params["delay_fraction"])
            side = scaled_size(full, scale, params["size_increment"])
        if "colout" in recipe.methods:
            side = colout_batch(torch.zeros(1, 1, side, side), **recipe.methods["colout"]).shape[-1]
        sides.add(side)
    return sides


@pytest.mark.parametrize("name", sorted(_published("imagenet")))
def test_a_published_imagenet_run_sees_few_image_sizes(name):
    recipe, full = _published("imagenet")[name]
    sizes = _image_sizes_over_a_run(recipe, full)
    assert len(sizes) <= IMAGE_SIZES_PER_RUN, sorted(sizes)
    if "progressive_resizing" in recipe.methods and "colout" not in recipe.methods:
        assert all(side % 32 == 0 or side == full for side in sizes), sorted(sizes)


def test_the_image_budget_is_the_bucketing_not_the_schedule():
    """With the old 4-px steps the same schedule gave a new size every few steps: 23 sizes from 88 to 176 px."""
    assert len({scaled_size(176, progressive_scale(f / 1000, 0.5, 0.2), 4) for f in range(1001)}) > 20
    assert len({scaled_size(176, progressive_scale(f / 1000, 0.5, 0.2)) for f in range(1001)}) <= 4


@pytest.mark.parametrize("name", sorted(_published("gpt2")))
def test_a_published_gpt2_run_sees_few_sequence_lengths(name):
    recipe, context = _published("gpt2")[name]
    args = recipe.methods.get("seq_length_warmup")
    lengths = {context}
    if args is not None:
        p = SeqLengthWarmup(**args).params
        lengths |= {seq_length_at(f / 1000, context, p["min_seq_length"], p["duration"], p["step_size"])
                    for f in range(1001)}
        assert len(lengths) > 2  # it still warms up
    assert len(lengths) <= 1 + context // TOKENS_STEP, sorted(lengths)
    assert all(n % TOKENS_STEP == 0 for n in lengths - {min(lengths)}), sorted(lengths)


class InputShapes(Callback):
    """The input shape of every forward, in training and in evaluation."""

    def __init__(self):
        self.train, self.eval = set(), set()

    def before_forward(self, state, logger):
        self.train.add(tuple(batch_inputs(state.batch).shape))

    def eval_before_forward(self, state, logger):
        self.eval.add(tuple(batch_inputs(state.batch).shape))


def _compiled_graphs(model: torch.nn.Module) -> list:
    """Compile ``model``'s forward (not GPT's loss) with a backend that runs each graph as traced and keeps them."""
    graphs = []

    def backend(graph_module, example_inputs):
        graphs.append(graph_module)
        return graph_module.forward

    torch.nn.Module.compile(model, backend=backend)
    return graphs


@pytest.mark.parametrize("task, name, options, budget", [
    ("imagenet", "hot", {"image_size": 128}, 2),  # 96 px, then 128 px; ColOut keeps each one size
    ("gpt2", "composer", {}, 1 + 256 // TOKENS_STEP),  # 8 tokens, then 64 to 256 in steps of 64
], ids=["imagenet:hot", "gpt2:composer"])
def test_a_whole_run_stays_within_its_shape_budget_and_compiles_no_more_graphs_than_shapes(
        tmp_path, seed_data, shard_cache, task, name, options, budget):
    torch._dynamo.reset()
    shapes = InputShapes()
    trainer = make_trainer(task, name, duration="20ba", batch_size=4, eval_interval="20ba", log_interval=10,
                           device="cpu", run_dir=tmp_path, save_checkpoints=False, callbacks=[shapes],
                           **_task_options(task, seed_data, **options))
    graphs = _compiled_graphs(trainer.state.model)
    assert trainer.fit().status == "completed"
    sides = {shape[-1] if task == "imagenet" else shape[1] for shape in shapes.train}
    assert 1 < len(sides) <= budget, sorted(shapes.train)
    # one graph per shape at most (a partial last batch and evaluation are shapes too); no recompile from
    # anything else (a drawn number, a rate held as a Python float)
    assert graphs and len(graphs) <= len(shapes.train) + len(shapes.eval), (len(graphs), shapes.train, shapes.eval)
    torch._dynamo.reset()


class TwoLayers(torch.nn.Module):
    """A user's model (its forward's code outside torch, which TorchDynamo compiles on every torch version) that
    notes the size of each batch its forward runs eager on (not counting the speed monitor's FLOP counts, eager
    under a dispatch mode), and raises on a batch narrower than ``refuse_below``."""

    def __init__(self, refuse_below: int = 0):
        super().__init__()
        torch.manual_seed(0)
        self.hidden, self.out, self.refuse_below = torch.nn.Linear(8, 32), torch.nn.Linear(32, 3), refuse_below
        self.eager = []

    def forward(self, x):
        if not torch.compiler.is_compiling() and not is_in_torch_dispatch_mode():
            self.eager.append(x.shape[0])
            if x.shape[0] < self.refuse_below:
                raise RuntimeError("a partial batch")
        return self.out(torch.relu(self.hidden(x)))


def _graph_inputs(model: torch.nn.Module) -> list:
    """Compile ``model`` as a user would, with a backend that keeps each graph's inputs: shapes, or ``"symbolic"``
    for a size TorchDynamo made dynamic."""
    graphs = []

    def backend(graph_module, example_inputs):
        graphs.append([tuple(i.shape) if isinstance(i, torch.Tensor) else "symbolic" for i in example_inputs])
        return graph_module.forward

    torch.nn.Module.compile(model, backend=backend)
    return graphs


def _trainer(model, tmp_path, train=None):
    """Two epochs of 200 samples in batches of 64 (the last of 8), evaluated on 100 in batches of 64 (the last of
    36; an evaluation batch of another size would be a second size, which TorchDynamo makes dynamic)."""
    from torch.utils.data import DataLoader, TensorDataset

    from helpers import toy_classification
    from speedkit import Trainer

    x, y = toy_classification(200)
    train = train or DataLoader(TensorDataset(x, y), batch_size=64)
    test = DataLoader(TensorDataset(x[:100], y[:100]), batch_size=64)
    return Trainer(model, train, eval_dataloader=test, max_duration="2ep", eval_interval="1ep", device="cpu",
                   run_dir=tmp_path, save_checkpoints=False, progress_bar=False)


def test_partial_last_batches_run_eager_and_compile_no_graph_of_their_own(tmp_path):
    """A partial last batch, compiled, would be a graph of its own (training time), and make TorchDynamo compile
    every later graph with a symbolic batch size; the Trainer runs it eager instead, every sample still trained."""
    torch._dynamo.reset()
    model = TwoLayers()
    graphs = _graph_inputs(model)
    trainer = _trainer(model, tmp_path)
    assert trainer.fit().status == "completed"
    assert trainer.state.timestamp.sample == 400
    assert len(graphs) == 2, graphs  # training's and evaluation's, each at its full batch
    assert [inputs for inputs in graphs if "symbolic" in inputs] == [], graphs
    assert model.eager == [8, 36, 8, 36]  # each epoch's last training batch, then its evaluation's last
    assert torch._dynamo.eval_frame._stance.stance == "default"
    torch._dynamo.reset()


def test_batches_that_vary_in_size_by_design_stay_compiled_but_the_last(tmp_path):
    """A loader whose batches vary in size (a token budget a batch, say): only the epoch's last runs eager."""
    from helpers import toy_classification

    torch._dynamo.reset()
    x, y = toy_classification(200)
    sizes = (64, 48, 64, 24)
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    train = [(x[start:start + size], y[start:start + size]) for start, size in zip(starts, sizes)]
    model = TwoLayers()
    _graph_inputs(model)
    assert _trainer(model, tmp_path, train).fit().status == "completed"
    assert 48 not in model.eager and 24 in model.eager
    torch._dynamo.reset()


def test_a_partial_batch_that_raises_leaves_torch_compiling(tmp_path):
    torch._dynamo.reset()
    model = TwoLayers(refuse_below=64)
    _graph_inputs(model)
    with pytest.raises(RuntimeError, match="a partial batch"):
        _trainer(model, tmp_path).fit()
    assert model.eager == [8] and torch._dynamo.eval_frame._stance.stance == "default"
    torch._dynamo.reset()


# ------------------------------------------------------------------------------- graph breaks, the loss

@pytest.mark.parametrize("task, name", ALL_PRESETS, ids=[f"{t}:{n}" for t, n in ALL_PRESETS])
def test_every_seed_preset_model_traces_with_no_graph_break(tmp_path, seed_data, shard_cache, task, name):
    trainer = make_trainer(task, name, duration="2ba", batch_size=4, device="cpu", run_dir=tmp_path,
                           save_checkpoints=False, **_task_options(task, seed_data))
    inputs = batch_inputs(next(iter(trainer.state.train_dataloader)))
    model = trainer.state.model.train()  # after every method's surgery (stochastic depth's hooks included)
    torch._dynamo.reset()
    explained = torch._dynamo.explain(model)(inputs)
    reasons = [f"{r.reason[:200]} at {r.user_stack[-1] if r.user_stack else '?'}" for r in explained.break_reasons]
    assert explained.graph_break_count == 0, "\n".join(reasons)
    torch._dynamo.reset()


def test_stochastic_depth_in_sample_mode_traces_as_one_graph_in_training_and_evaluation():
    from speedkit.models import get_model

    model = get_model("resnet18", num_classes=3)
    apply_stochastic_depth(model, 0.2, "sample")
    for training in (True, False):
        model.train(training)
        torch._dynamo.reset()
        explained = torch._dynamo.explain(model)(torch.randn(2, 3, 32, 32))
        assert explained.graph_break_count == 0, [r.reason[:200] for r in explained.break_reasons]
    torch._dynamo.reset()


def test_gpts_compiled_loss_makes_no_fp32_copy_of_the_logits():
    """Compiled with the model (GPT.compile), the loss's upcast to fp32 fuses into the softmax's reductions:
    Inductor's generated code, forward and backward, holds no fp32 buffer the size of the logits."""
    from torch._inductor.utils import run_and_get_code

    from speedkit.models.gpt import GPT, next_token_loss

    model = GPT(vocab_size=97, block_size=8, n_layer=1, n_head=2, n_embd=16)
    model.compile()
    assert model._compiled_loss is not None
    logits = torch.randn(2, 8, 97, dtype=torch.bfloat16, requires_grad=True)
    targets = torch.randint(0, 97, (2, 8))
    torch._dynamo.reset()

    def step():
        model.loss(logits, (None, targets)).backward()

    _, code = run_and_get_code(step)
    assert len(code) == 2, "a forward and a backward graph"
    rows = f"({2 * 8}, 97)"
    buffers = [line.strip() for source in code for line in source.splitlines()
               if "empty_strided" in line and "(" in line]
    assert not [b for b in buffers if rows in b and "float32" in b], buffers
    assert torch.allclose(model.loss(logits, (None, targets)), next_token_loss(logits, targets), atol=1e-3)
    torch._dynamo.reset()


# ---------------------------------------------------------------------------------------- the gpu sizes

def test_the_gpu_sizes_compile_the_model_and_the_cpu_rehearsals_do_not():
    from speedkit.tasks.builtin.gpt2 import gpt2_recipes
    from speedkit.tasks.builtin.imagenet import imagenet_recipes

    for recipes in (imagenet_recipes("gpu"), gpt2_recipes("gpu")):
        assert all(recipe.methods.get("torch_compile") == {} for recipe in recipes.values())
    for recipes in (imagenet_recipes("cpu"), gpt2_recipes("cpu")):
        assert not any("torch_compile" in recipe.methods for recipe in recipes.values())


def test_a_task_at_its_gpu_sizes_resolves_to_a_compiled_recipe(seed_data, shard_cache):
    from speedkit.tasks.builtin.gpt2 import gpt2_task

    with pytest.warns(UserWarning):
        task = gpt2_task(seed_data["gpt2"], sizes="gpu")
    assert all("torch_compile" in task.recipe(name).methods for name in task.recipes)


def test_cudnns_autotuner_is_on_while_a_run_on_cuda_fits_and_the_process_gets_its_setting_back(monkeypatch):
    from speedkit.core.devices import resolve_device
    from speedkit.train.parts import kernel_choice

    cuda = torch.device("cuda")  # a device object: no CUDA needed to choose for it
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)
    torch.use_deterministic_algorithms(False)  # tests/conftest.py restores the mode afterwards
    resolve_device(cuda)
    assert torch.backends.cudnn.benchmark is False  # naming a device changes nothing of torch's
    cases = ((cuda, False, True), (torch.device("cpu"), False, False), (cuda, True, False))
    for device, deterministic, inside in cases:
        with kernel_choice(deterministic, device):
            assert torch.backends.cudnn.benchmark is inside, (device, deterministic)
            assert torch.are_deterministic_algorithms_enabled() is deterministic
        assert torch.backends.cudnn.benchmark is False and not torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)  # the user's own choice: no autotuning under it
    with kernel_choice(False, cuda):
        assert torch.backends.cudnn.benchmark is False
    assert torch.are_deterministic_algorithms_enabled()
