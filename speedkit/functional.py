"""The functional forms of every method, for use in any plain PyTorch loop: ``import speedkit.functional as sf``."""
from speedkit.algorithms.channels_last import apply_channels_last, to_channels_last
from speedkit.algorithms.label_smoothing import smooth_labels

__all__ = ["apply_channels_last", "smooth_labels", "to_channels_last"]
