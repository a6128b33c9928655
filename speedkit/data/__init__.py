"""Datasets and fast loaders.

Fashion-MNIST and the Python-docs text corpus are read from local files (Debian packages
``dataset-fashion-mnist`` and ``python3.11-doc``); nothing is downloaded unless asked for.
Small image sets are served by :class:`BatchLoader`, which keeps them as tensors on the
training device and augments whole batches at once.
"""

from .batch_loader import Augment, BatchLoader
from .fashion_mnist import CLASSES as FASHION_MNIST_CLASSES
from .fashion_mnist import FashionMNIST, ImageArrays, load_fashion_mnist, locate_fashion_mnist, read_idx
from .loaders import fashion_mnist_loaders, stratified_indices
from .text import ByteCorpus, TokenBatchLoader, load_text_corpus, split_files
from .vision import cifar10, cifar100, image_folder

__all__ = [
    "Augment",
    "BatchLoader",
    "ByteCorpus",
    "FASHION_MNIST_CLASSES",
    "FashionMNIST",
    "ImageArrays",
    "TokenBatchLoader",
    "cifar10",
    "cifar100",
    "fashion_mnist_loaders",
    "image_folder",
    "load_fashion_mnist",
    "load_text_corpus",
    "locate_fashion_mnist",
    "read_idx",
    "split_files",
    "stratified_indices",
]
