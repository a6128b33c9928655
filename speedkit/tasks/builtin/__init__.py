"""The built-in tasks, one module each, defined with the public ``Task`` like a user's: ``fashion_mnist``,
``pydocs`` (the Python docs language model), and two tasks over the user's own files, ``image_folder`` and
``text_folder``; ``_shared`` holds what they share.

Nothing here registers anything: the registry (``speedkit.tasks.task.TASKS``, ``FOLDER_TASKS``) knows these
by name and imports them when first asked. The folder tasks are functions of the folder
(``image_folder_task(DIR)``): ``--task image-folder --data DIR`` calls them through
``speedkit.tasks.resolve_task``. Their presets are data: ``speedkit/tasks/presets/<task>.yaml``.
"""
from speedkit.tasks.builtin._shared import vision_model_factory
from speedkit.tasks.builtin.fashion_mnist import FASHION_MNIST, fashion_mnist_torch_loader
from speedkit.tasks.builtin.image_folder import image_folder_task, load_image_folder
from speedkit.tasks.builtin.pydocs import PYDOCS
from speedkit.tasks.builtin.text_folder import text_folder_task

__all__ = ["FASHION_MNIST", "PYDOCS", "fashion_mnist_torch_loader",
           "image_folder_task", "load_image_folder", "text_folder_task", "vision_model_factory"]
