"""Tests for speedkit.data: Fashion-MNIST files, the batch loader, the text corpus, vision wrappers.

All on CPU and offline. Synthetic images encode their own pixel coordinates so that crops and
flips can be checked exactly; labels are set to the sample index so every output image can be
matched with its source.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from speedkit.data import (
    Augment,
    BatchLoader,
    FashionMNIST,
    TokenBatchLoader,
    cifar10,
    cifar100,
    fashion_mnist_loaders,
    image_folder,
    load_fashion_mnist,
    load_text_corpus,
    stratified_indices,
)
from speedkit.data import fashion_mnist as fm
from speedkit.data import text as text_module

from helpers import needs_fmnist, needs_python_docs


# ============================================================================ helpers


def write_idx(path: Path, array: np.ndarray, gz: bool = True) -> Path:
    """Write a uint8 array as an IDX file (the format of the MNIST family)."""
    header = bytes([0, 0, 0x08, array.ndim]) + np.array(array.shape, dtype=">u4").tobytes()
    payload = header + np.ascontiguousarray(array, dtype=np.uint8).tobytes()
    path = path.with_name(path.name + ".gz") if gz else path
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(payload) if gz else payload)
    return path


def write_fake_fmnist(folder: Path, n_train: int = 20, n_test: int = 10, gz: bool = True, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    arrays = {
        "train_x": rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
        "train_y": (np.arange(n_train) % 10).astype(np.uint8),
        "test_x": rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8),
        "test_y": (np.arange(n_test) % 10).astype(np.uint8),
    }
    for key, array in arrays.items():
        write_idx(folder / fm.FILE_NAMES[key], array, gz=gz)
    return arrays


@pytest.fixture
def isolated_search(monkeypatch, tmp_path):
    """Point every default Fashion-MNIST location at empty temporary folders."""
    monkeypatch.delenv(fm.ENV_VAR, raising=False)
    monkeypatch.setattr(fm, "SYSTEM_DIRS", [tmp_path / "system"])
    monkeypatch.setattr(fm, "CACHE_ROOT", tmp_path / "cache")
    return tmp_path


def coordinate_images(n: int, height: int, width: int, channels: int = 1) -> torch.Tensor:
    """uint8 images whose pixel (r, c) holds 1 + r * width + c (0 is left for zero padding);
    channel k holds the same code plus k * 7 wrapped, so channels are distinguishable."""
    assert height * width < 250
    code = 1 + torch.arange(height)[:, None] * width + torch.arange(width)[None, :]
    image = torch.stack([(code + 7 * k) % 256 for k in range(channels)])
    return image.expand(n, channels, height, width).to(torch.uint8).clone()


def raw_pixels(batch_x: torch.Tensor) -> torch.Tensor:
    """Undo the /255 of a loader built with mean=0, std=1."""
    return torch.round(batch_x.float() * 255).to(torch.int64)


def collect(loader) -> list:
    return [(x.clone(), y.clone()) for x, y in loader]


def same_batches(a: list, b: list) -> bool:
    return len(a) == len(b) and all(torch.equal(xa, xb) and torch.equal(ya, yb) for (xa, ya), (xb, yb) in zip(a, b))


# ============================================================================ Fashion-MNIST


@needs_fmnist
def test_real_fashion_mnist_loads_with_expected_shapes_and_balance():
    data = load_fashion_mnist()
    assert data.train_x.shape == (60000, 28, 28) and data.test_x.shape == (10000, 28, 28)
    assert data.train_x.dtype == torch.uint8 and data.test_x.dtype == torch.uint8
    assert data.train_y.dtype == torch.int64 and data.test_y.dtype == torch.int64
    assert torch.equal(torch.bincount(data.train_y), torch.full((10,), 6000))
    assert torch.equal(torch.bincount(data.test_y), torch.full((10,), 1000))
    assert len(data.classes) == 10 and data.classes[0] == "T-shirt/top" and data.classes[9] == "Ankle boot"
    # The well-known statistics of the training pixels, checked against a direct computation.
    pixels = data.train_x.double() / 255
    assert data.mean == pytest.approx(pixels.mean().item(), abs=1e-9)
    assert data.std == pytest.approx(pixels.std(unbiased=False).item(), abs=1e-9)
    assert data.mean == pytest.approx(0.2860, abs=1e-3) and data.std == pytest.approx(0.3530, abs=1e-3)
    # Second call is served from the in-process cache.
    assert load_fashion_mnist().train_x is data.train_x


@needs_fmnist
def test_fashion_mnist_dataset_feeds_a_standard_dataloader():
    from PIL import Image
    from torchvision import transforms

    raw = FashionMNIST(train=False)
    image, label = raw[0]
    assert isinstance(image, Image.Image) and image.size == (28, 28) and isinstance(label, int)
    assert len(raw) == 10000 and label == int(load_fashion_mnist().test_y[0])

    dataset = FashionMNIST(train=False, transform=transforms.ToTensor())
    x, y = next(iter(torch.utils.data.DataLoader(dataset, batch_size=8)))
    assert x.shape == (8, 1, 28, 28) and y.tolist() == load_fashion_mnist().test_y[:8].tolist()
    assert torch.allclose(x[:, 0], load_fashion_mnist().test_x[:8].float() / 255)


def test_missing_fashion_mnist_says_how_to_get_it(isolated_search):
    root = isolated_search / "my-data"
    root.mkdir()
    with pytest.raises(FileNotFoundError) as info:
        load_fashion_mnist(root=root)
    message = str(info.value)
    assert "dataset-fashion-mnist" in message and "download=True" in message
    for place in (root, isolated_search / "system", isolated_search / "cache"):
        assert str(place) in message


def test_partial_folder_is_reported(isolated_search):
    root = isolated_search / "partial"
    write_idx(root / fm.FILE_NAMES["train_x"], np.zeros((2, 28, 28), np.uint8))
    with pytest.raises(FileNotFoundError, match="t10k-labels-idx1-ubyte"):
        load_fashion_mnist(root=root)


@pytest.mark.parametrize("layout", ["gz", "gunzipped", "torchvision"])
def test_fashion_mnist_layouts_from_root(isolated_search, layout):
    root = isolated_search / "data"
    folder = root / "FashionMNIST" / "raw" if layout == "torchvision" else root
    arrays = write_fake_fmnist(folder, gz=(layout == "gz"))
    data = load_fashion_mnist(root=root)
    assert np.array_equal(data.train_x.numpy(), arrays["train_x"])
    assert np.array_equal(data.test_y.numpy(), arrays["test_y"])
    assert data.train_y.dtype == torch.int64
    assert data.mean == pytest.approx(arrays["train_x"].mean() / 255)
    assert data.std == pytest.approx((arrays["train_x"] / 255).std())


def test_fashion_mnist_env_var_and_search_order(isolated_search, monkeypatch):
    env_arrays = write_fake_fmnist(isolated_search / "env", seed=1)
    monkeypatch.setenv(fm.ENV_VAR, str(isolated_search / "env"))
    assert np.array_equal(load_fashion_mnist().train_x.numpy(), env_arrays["train_x"])
    # An explicit root comes before the environment variable.
    root_arrays = write_fake_fmnist(isolated_search / "root", seed=2)
    assert np.array_equal(load_fashion_mnist(root=isolated_search / "root").train_x.numpy(), root_arrays["train_x"])


def test_replaced_file_is_reread_not_served_from_cache(isolated_search):
    root = isolated_search / "data"
    write_fake_fmnist(root, seed=1)
    first = load_fashion_mnist(root=root)
    new = write_fake_fmnist(root, n_train=30, seed=2)
    assert np.array_equal(load_fashion_mnist(root=root).train_x.numpy(), new["train_x"])
    assert first.train_x.shape[0] == 20


@pytest.mark.parametrize("damage", ["magic", "truncated", "extra_bytes", "not_gzip", "label_count", "image_size"])
def test_corrupt_idx_raises_value_error_naming_the_file(isolated_search, damage):
    root = isolated_search / "data"
    write_fake_fmnist(root)
    images = root / "train-images-idx3-ubyte.gz"
    payload = gzip.decompress(images.read_bytes())
    if damage == "magic":
        images.write_bytes(gzip.compress(b"\x00\x00\x09\x03" + payload[4:]))
    elif damage == "truncated":
        images.write_bytes(gzip.compress(payload[:-100]))
    elif damage == "extra_bytes":
        images.write_bytes(gzip.compress(payload + bytes(100)))
    elif damage == "not_gzip":
        images.write_bytes(b"this is not gzip data at all")
    elif damage == "label_count":
        write_idx(root / "train-labels-idx1-ubyte", np.zeros(19, np.uint8))
    elif damage == "image_size":
        write_idx(root / "train-images-idx3-ubyte", np.zeros((20, 28, 27), np.uint8))
    with pytest.raises(ValueError) as info:
        load_fashion_mnist(root=root)
    expected = "train-labels-idx1-ubyte" if damage == "label_count" else "train-images-idx3-ubyte"
    assert expected in str(info.value)


# ============================================================================ BatchLoader


def labelled(n: int, height: int = 12, width: int = 12, channels: int = 1):
    """Coordinate-coded images, each distinguishable by its label = its index."""
    return coordinate_images(n, height, width, channels), torch.arange(n)


def test_batch_loader_shapes_sizes_and_normalisation():
    x = torch.randint(0, 256, (50, 12, 10), dtype=torch.uint8)
    y = torch.arange(50)
    loader = BatchLoader(x, y, batch_size=16, mean=0.3, std=0.2, seed=1)
    assert len(loader) == 4 and loader.dataset_size == 50 and loader.batch_size == 16
    batches = collect(loader)
    assert [len(b[1]) for b in batches] == [16, 16, 16, 2]
    for bx, by in batches:
        assert bx.shape == (len(by), 1, 12, 10) and bx.dtype == torch.float32 and by.dtype == torch.int64
        assert torch.allclose(bx[:, 0], (x[by].float() / 255 - 0.3) / 0.2, atol=1e-5)
    labels = torch.cat([b[1] for b in batches])
    assert sorted(labels.tolist()) == list(range(50)) and labels.tolist() != list(range(50))
    assert len(loader.with_options(drop_last=True)) == 3
    assert [len(b[1]) for b in loader.with_options(drop_last=True)] == [16, 16, 16]


def test_batch_loader_per_channel_stats_dtype_and_channels_last():
    x = torch.randint(0, 256, (8, 3, 6, 6), dtype=torch.uint8)
    mean, std = (0.1, 0.5, 0.9), (0.2, 0.3, 0.4)
    loader = BatchLoader(x, torch.arange(8), 8, shuffle=False, mean=mean, std=std)
    bx, _ = next(iter(loader))
    expected = (x.float() / 255 - torch.tensor(mean)[:, None, None]) / torch.tensor(std)[:, None, None]
    assert torch.allclose(bx, expected, atol=1e-5)
    fast = loader.with_options(dtype=torch.bfloat16, channels_last=True)
    bx16, _ = next(iter(fast))
    assert bx16.dtype == torch.bfloat16 and bx16.is_contiguous(memory_format=torch.channels_last)
    assert torch.allclose(bx16.float(), expected, atol=0.05)
    with pytest.raises(ValueError, match="channels"):
        BatchLoader(x, torch.arange(8), 8, mean=(0.1, 0.2))


def test_float_images_are_not_rescaled():
    x = torch.rand(6, 4, 4)
    bx, by = next(iter(BatchLoader(x, torch.arange(6), 6, shuffle=False)))
    assert torch.allclose(bx[:, 0], x)


def test_augmented_epoch_keeps_every_label_once():
    x, _ = labelled(103)
    y = torch.arange(103) % 7
    loader = BatchLoader(x, y, 10, augment=Augment(crop_pad=3, flip="random"), seed=5)
    for epoch in range(2):
        loader.set_epoch(epoch)
        labels = torch.cat([by for _, by in loader])
        assert torch.equal(torch.sort(labels).values, torch.sort(y).values)


@settings(max_examples=20, deadline=None)
@given(
    height=st.integers(4, 14),
    width=st.integers(4, 14),
    pad=st.integers(1, 3),
    pad_mode=st.sampled_from(["reflect", "zeros"]),
    flip=st.sampled_from([None, "random"]),
    channels=st.sampled_from([1, 3]),
)
def test_crop_shifts_content_by_at_most_pad(height, width, pad, pad_mode, flip, channels):
    x, y = labelled(40, height, width, channels)
    loader = BatchLoader(x, y, 16, augment=Augment(crop_pad=pad, flip=flip, pad_mode=pad_mode), seed=3)
    # Every allowed outcome, made independently with torch's own padding: shift by (dy, dx)
    # within +-pad, optionally mirrored. All samples share one image, so one table serves all.
    candidates, names = reference_translations(x[0], pad, pad_mode, mirror=flip is not None)
    seen = set()
    for bx, by in loader:
        for image in raw_pixels(bx):
            match = torch.nonzero((candidates == image).flatten(1).all(1)).flatten()
            assert len(match) > 0, "output is not a translation by at most pad (or its mirror)"
            seen.add(names[int(match[0])])
    assert len({(dy, dx) for dy, dx, _ in seen}) > 3  # the crop really moves images, by varied amounts
    if flip:
        assert {m for _, _, m in seen} == {False, True}


def reference_translations(image: torch.Tensor, pad: int, pad_mode: str, mirror: bool):
    """[K, C, H, W] stack of image shifted by every (dy, dx) in [-pad, pad]^2 (and mirrored)."""
    height, width = image.shape[-2:]
    mode = "reflect" if pad_mode == "reflect" else "constant"
    padded = torch.nn.functional.pad(image.double()[None], (pad, pad, pad, pad), mode=mode)[0].long()
    candidates, names = [], []
    for dy in range(-pad, pad + 1):
        for dx in range(-pad, pad + 1):
            # Output pixel i shows input pixel i - dy, which sits at i - dy + pad in `padded`.
            shifted = padded[:, pad - dy : pad - dy + height, pad - dx : pad - dx + width]
            for mirrored in ([False, True] if mirror else [False]):
                candidates.append(torch.flip(shifted, dims=[-1]) if mirrored else shifted)
                names.append((dy, dx, mirrored))
    return torch.stack(candidates), names


def test_flipped_images_equal_torch_flip_of_originals():
    x, y = labelled(64, 9, 11, channels=2)
    loader = BatchLoader(x, y, 16, augment=Augment(crop_pad=0, flip="random"), seed=0)
    flipped = 0
    for bx, by in loader:
        for image, index in zip(raw_pixels(bx), by):
            original = x[index].long()
            if torch.equal(image, torch.flip(original, dims=[-1])):
                flipped += 1
            else:
                assert torch.equal(image, original)
    assert 10 < flipped < 54  # about half, by chance


def flip_states(loader: BatchLoader, x: torch.Tensor, epoch: int) -> torch.Tensor:
    """For each sample index, whether it came out mirrored in the given epoch."""
    loader.set_epoch(epoch)
    state = torch.full((len(x),), -1)
    for bx, by in loader:
        for image, index in zip(raw_pixels(bx), by):
            state[index] = int(torch.equal(image, torch.flip(x[index].long(), dims=[-1])))
    assert (state >= 0).all()
    return state.bool()


def test_alternating_flip_flips_each_sample_in_exactly_one_of_two_epochs():
    x, y = labelled(60, 8, 8)
    loader = BatchLoader(x, y, 16, augment=Augment(crop_pad=0, flip="alternating"), seed=2)
    states = [flip_states(loader, x, epoch) for epoch in range(4)]
    for a, b in zip(states, states[1:]):
        assert torch.equal(a, ~b)
    assert 15 < int(states[0].sum()) < 45  # a random half, not all-or-nothing
    other_seed = loader.with_options(seed=3)
    assert not torch.equal(flip_states(other_seed, x, 0), states[0])


def test_same_seed_and_epoch_give_same_batches_and_epochs_differ():
    x, y = labelled(70)
    augment = Augment(crop_pad=2, flip="random")
    a = BatchLoader(x, y, 16, augment=augment, seed=11)
    b = BatchLoader(x, y, 16, augment=augment, seed=11)
    a.set_epoch(3)
    b.set_epoch(3)
    epoch3 = collect(a)
    assert same_batches(epoch3, collect(b))
    a.set_epoch(3)
    assert same_batches(epoch3, collect(a))
    a.set_epoch(4)
    epoch4 = collect(a)
    assert not same_batches(epoch3, epoch4)
    assert torch.cat([e[1] for e in epoch3]).tolist() != torch.cat([e[1] for e in epoch4]).tolist()
    c = BatchLoader(x, y, 16, augment=augment, seed=12)
    c.set_epoch(3)
    assert not same_batches(epoch3, collect(c))


def test_unshuffled_loader_keeps_dataset_order():
    x, y = labelled(30)
    labels = torch.cat([by for _, by in BatchLoader(x, y, 8, shuffle=False)])
    assert labels.tolist() == list(range(30))


def test_iter_from_yields_the_tail_of_a_full_iteration():
    x, y = labelled(90)
    loader = BatchLoader(x, y, 16, augment=Augment(crop_pad=2, flip="alternating"), seed=4)
    loader.set_epoch(2)
    full = collect(loader)
    for k in (0, 1, 3, len(full) - 1, len(full)):
        loader.set_epoch(2)
        assert same_batches(collect(loader.iter_from(k)), full[k:])


def test_a_full_pass_advances_the_epoch_unless_set():
    x, y = labelled(40)
    loader = BatchLoader(x, y, 16, seed=0)
    first = collect(loader)
    assert loader.epoch == 1
    second = collect(loader)
    loader.set_epoch(1)
    assert same_batches(second, collect(loader)) and not same_batches(first, second)
    iterator = iter(loader)  # a partial pass leaves the epoch alone
    next(iterator)
    del iterator
    assert loader.epoch == 2
    iterator = iter(loader)  # the epoch is fixed when iteration starts
    loader.set_epoch(7)
    rest = [(x.clone(), y.clone()) for x, y in iterator]
    loader.set_epoch(2)
    assert same_batches(rest, collect(loader))


def test_loader_leaves_global_rng_and_stored_images_untouched():
    x, y = labelled(40)
    stored = x.clone()
    torch.manual_seed(123)
    state = torch.get_rng_state()
    loader = BatchLoader(x, y, 16, augment=Augment(crop_pad=2, flip="random"), seed=0)
    collect(loader)
    assert torch.equal(torch.get_rng_state(), state)
    assert torch.equal(loader.images, stored)
    assert torch.equal(x, stored)


def test_with_options_copies_and_rejects_unknown_options():
    x, y = labelled(40)
    loader = BatchLoader(x, y, 16, augment=Augment(), seed=0)
    loader.set_epoch(5)
    bigger = loader.with_options(batch_size=32, augment=None)
    assert bigger.batch_size == 32 and bigger.augment is None and bigger.epoch == 5 and len(bigger) == 2
    assert loader.batch_size == 16 and loader.augment == Augment()
    with pytest.raises(TypeError, match="batchsize"):
        loader.with_options(batchsize=8)


def test_invalid_arguments_are_rejected():
    x, y = labelled(10)
    with pytest.raises(ValueError):
        Augment(flip="sometimes")
    with pytest.raises(ValueError):
        BatchLoader(x, y[:5], 4)
    with pytest.raises(ValueError):
        BatchLoader(x, y, 0)
    with pytest.raises(ValueError, match="crop_pad"):
        BatchLoader(x, y, 4, augment=Augment(crop_pad=12))


# ============================================================================ loaders and subsets


def test_stratified_indices_keep_class_proportions():
    labels = torch.cat([torch.full((n,), c) for c, n in enumerate([100, 50, 10, 200])])
    labels = labels[torch.randperm(len(labels), generator=torch.Generator().manual_seed(0))]
    index = stratified_indices(labels, 0.2, seed=0)
    assert torch.equal(torch.bincount(labels[index]), torch.tensor([20, 10, 2, 40]))
    assert torch.equal(index, torch.sort(index).values) and len(index.unique()) == len(index)
    assert torch.equal(index, stratified_indices(labels, 0.2, seed=0))
    assert not torch.equal(index, stratified_indices(labels, 0.2, seed=1))
    assert torch.bincount(labels[stratified_indices(labels, 0.001)]).tolist() == [1, 1, 1, 1]


@needs_fmnist
def test_fashion_mnist_loaders_subset_and_normalisation():
    train, test = fashion_mnist_loaders(batch_size=500, data_fraction=0.1, augment=None, seed=0)
    assert train.dataset_size == 6000 and test.dataset_size == 10000
    assert torch.equal(torch.bincount(train.labels), torch.full((10,), 600))
    assert len(train) == 12 and test.batch_size == 1024 and not test.shuffle and test.augment is None
    pixels = torch.cat([bx for bx, _ in test])
    assert abs(pixels.mean().item()) < 0.05 and abs(pixels.std().item() - 1) < 0.05
    _, small_test = fashion_mnist_loaders(data_fraction=0.5, eval_fraction=0.25)
    assert small_test.dataset_size == 2500
    assert torch.equal(torch.bincount(small_test.labels), torch.full((10,), 250))
    full_train, _ = fashion_mnist_loaders()
    assert full_train.dataset_size == 60000 and full_train.augment == Augment(crop_pad=2, flip="random")


# ============================================================================ text corpus


def write_corpus(root: Path, n_files: int = 12) -> dict:
    """Files whose bytes name their file: file i is made only of the letter chr(65 + i)."""
    contents = {}
    for i in range(n_files):
        path = root / ("sub" if i % 2 else "") / f"doc{i:02d}.rst.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(bytes([65 + i]) * (200 + 10 * i))
        contents[path.relative_to(root)] = bytes([65 + i]) * (200 + 10 * i)
    (root / "image.png").write_bytes(b"\x89PNG not text")
    (root / "notes.md").write_bytes(b"z" * 50)
    contents[Path("notes.md")] = b"z" * 50
    return contents


def test_corpus_split_is_by_file_disjoint_and_deterministic(tmp_path):
    contents = write_corpus(tmp_path)
    corpus = load_text_corpus(tmp_path, val_fraction=0.25, seed=0)
    train, val = set(corpus.train_files), set(corpus.val_files)
    assert train and val and not (train & val) and train | val == set(contents)
    assert len(val) == round(0.25 * len(contents)) and corpus.vocab_size == 256
    assert corpus.train.dtype == torch.uint8 and corpus.val.dtype == torch.uint8
    assert bytes(corpus.train.tolist()) == b"\n\n".join(contents[f] for f in sorted(corpus.train_files))
    assert bytes(corpus.val.tolist()) == b"\n\n".join(contents[f] for f in sorted(corpus.val_files))
    again = load_text_corpus(tmp_path, val_fraction=0.25, seed=0)
    assert again.val_files == corpus.val_files and torch.equal(again.train, corpus.train)
    others = [load_text_corpus(tmp_path, val_fraction=0.25, seed=s).val_files for s in range(1, 4)]
    assert any(o != corpus.val_files for o in others)


def test_a_text_folder_with_its_own_train_and_val_keeps_that_split(tmp_path):
    """A corpus laid out train/ and val/ (as a user who split it by source would) is not split again."""
    for split, names in (("train", ("a", "b", "c")), ("val", ("d",))):
        (tmp_path / split).mkdir()
        for name in names:
            (tmp_path / split / f"{name}.txt").write_text(f"text {name} " * 20)
    corpus = load_text_corpus(tmp_path, val_fraction=0.5, seed=3)
    assert [f.as_posix() for f in corpus.val_files] == ["val/d.txt"]
    assert [f.as_posix() for f in corpus.train_files] == ["train/a.txt", "train/b.txt", "train/c.txt"]
    (tmp_path / "stray.txt").write_text("outside both")
    with pytest.raises(ValueError, match="outside both .*stray.txt.*move them into train/ or val/"):
        load_text_corpus(tmp_path)


def test_corpus_errors_say_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setattr(text_module, "DEFAULT_TEXT_ROOT", tmp_path / "absent")
    with pytest.raises(FileNotFoundError, match="python3.11-doc"):
        load_text_corpus()
    with pytest.raises(FileNotFoundError):
        load_text_corpus(tmp_path / "nowhere")
    (tmp_path / "only.bin").write_bytes(b"x")
    with pytest.raises(FileNotFoundError, match=".txt"):
        load_text_corpus(tmp_path)


@needs_python_docs
def test_python_docs_corpus_splits_by_file():
    corpus = load_text_corpus()
    assert len(corpus.train_files) + len(corpus.val_files) > 400
    assert not set(corpus.train_files) & set(corpus.val_files)
    assert len(corpus.val_files) == round(0.1 * (len(corpus.train_files) + len(corpus.val_files)))
    assert len(corpus.train) > 5_000_000 and len(corpus.val) > 200_000
    assert "Python" in corpus.decode(corpus.train[:100_000])


def test_token_batches_are_next_byte_pairs_from_the_right_split(tmp_path):
    write_corpus(tmp_path)
    corpus = load_text_corpus(tmp_path, val_fraction=0.25, seed=0)
    letters = {split: set(bytes(getattr(corpus, split).tolist())) for split in ("train", "val")}
    loader = TokenBatchLoader(corpus.train, seq_len=16, batch_size=4, steps_per_epoch=25, seed=1)
    assert len(loader) == 25 and loader.tokens_per_batch == 64
    windows = corpus.train.long().unfold(0, 17, 1)  # every 17-byte window of the training bytes
    seen = set()
    for x, y in loader:
        assert x.shape == y.shape == (4, 16) and x.dtype == y.dtype == torch.int64
        assert torch.equal(x[:, 1:], y[:, :-1])
        # Each (x, y) row pair is one window of the training bytes: y is x moved on by one.
        joined = torch.cat([x, y[:, -1:]], dim=1)
        assert (joined[:, None, :] == windows[None]).all(-1).any(-1).all()
        seen |= set(x.flatten().tolist())
    assert seen <= letters["train"] and not (seen & (letters["val"] - {10}))


def test_token_loader_epochs_are_reproducible_and_resumable():
    data = torch.randint(0, 256, (5000,), dtype=torch.uint8)
    loader = TokenBatchLoader(data, seq_len=32, batch_size=8, seed=3)
    assert len(loader) == (4999 // 32) // 8
    loader.set_epoch(1)
    epoch1 = collect(loader)
    assert loader.epoch == 2
    loader.set_epoch(1)
    assert same_batches(epoch1, collect(loader))
    loader.set_epoch(1)
    assert same_batches(collect(loader.iter_from(5)), epoch1[5:])
    loader.set_epoch(2)
    assert not same_batches(epoch1, collect(loader))


def test_token_eval_mode_covers_the_data_with_non_overlapping_windows():
    data = torch.randint(0, 256, (1000,), dtype=torch.uint8)
    loader = TokenBatchLoader(data, seq_len=30, batch_size=4, shuffle=False)
    windows = (1000 - 1) // 30
    assert len(loader) == -(-windows // 4)
    batches = collect(loader)
    assert same_batches(batches, collect(loader))  # fixed, whatever the epoch
    x = torch.cat([b[0] for b in batches])
    y = torch.cat([b[1] for b in batches])
    assert torch.equal(x.flatten(), data[: windows * 30].long())
    assert torch.equal(y.flatten(), data[1 : windows * 30 + 1].long())
    limited = TokenBatchLoader(data, seq_len=30, batch_size=4, shuffle=False, steps_per_epoch=3)
    assert len(limited) == 3 and same_batches(collect(limited), batches[:3])
    with pytest.raises(ValueError):
        TokenBatchLoader(data[:10], seq_len=10, batch_size=2)


# ============================================================================ vision wrappers


@pytest.mark.parametrize("make, folder", [(cifar10, "cifar-10-batches-py"), (cifar100, "cifar-100-python")])
def test_missing_cifar_raises_clear_file_not_found(tmp_path, make, folder):
    with pytest.raises(FileNotFoundError) as info:
        make(tmp_path, train=True)
    message = str(info.value)
    assert folder in message and "download=True" in message and str(tmp_path) in message
    # A local archive is used without the network, but only if it is the genuine one.
    archive = "cifar-10-python.tar.gz" if make is cifar10 else "cifar-100-python.tar.gz"
    (tmp_path / archive).write_bytes(b"not the real archive")
    with pytest.raises(ValueError, match="md5"):
        make(tmp_path, train=False)


def test_image_folder_loads_and_explains_a_wrong_layout(tmp_path):
    from PIL import Image

    with pytest.raises(FileNotFoundError, match="does not exist"):
        image_folder(tmp_path / "absent")
    with pytest.raises(FileNotFoundError, match="no class subfolders"):
        image_folder(tmp_path)
    for cls, count in (("cat", 2), ("dog", 3)):
        (tmp_path / cls).mkdir()
        for i in range(count):
            Image.new("RGB", (5, 4), color=(i * 40, 0, 0)).save(tmp_path / cls / f"{i}.png")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="empty"):
        image_folder(tmp_path)
    (tmp_path / "empty").rmdir()
    dataset = image_folder(tmp_path, transform=lambda image: torch.tensor(image.size))
    assert len(dataset) == 5 and dataset.class_to_idx == {"cat": 0, "dog": 1}
    assert dataset[0][0].tolist() == [5, 4] and dataset[4][1] == 1
