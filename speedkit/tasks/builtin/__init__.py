"""The built-in tasks, one module each, defined with the public ``Task`` like a user's: ``fashion_mnist``,
``pydocs`` (the Python docs language model), and two tasks over the user's own files, ``image_folder`` and
``text_folder``; ``_shared`` holds what they share.

The folder tasks are functions of the folder (``image_folder_task(DIR)``): ``--task image-folder
--data DIR`` calls them through ``speedkit.tasks.resolve_task``.
"""
from speedkit.tasks.builtin._shared import vision_model_factory
from speedkit.tasks.builtin.fashion_mnist import FASHION_MNIST, fashion_mnist_torch_loader
from speedkit.tasks.builtin.image_folder import image_folder_task, load_image_folder
from speedkit.tasks.builtin.pydocs import PYDOCS
from speedkit.tasks.builtin.text_folder import text_folder_task

BUILT_IN_TASKS = (FASHION_MNIST, PYDOCS)
FOLDER_TASKS = {"image-folder": image_folder_task, "text-folder": text_folder_task}
__all__ = ["BUILT_IN_TASKS", "FASHION_MNIST", "FOLDER_TASKS", "PYDOCS", "fashion_mnist_torch_loader",
           "image_folder_task", "load_image_folder", "text_folder_task", "vision_model_factory"]
