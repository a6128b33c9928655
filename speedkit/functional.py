"""The functional form of every method, for any plain PyTorch loop: ``import speedkit.functional as sf``.

Surgeries (``apply_*``) change a model in place and return a report of what they changed; batch
functions take and return tensors; helpers for your own loop (EMA, SWA, clipping) act on a model or
its parameters. Each comes from its method's module in ``speedkit.algorithms``, beside its card.
"""
from speedkit.algorithms.channels_last import apply_channels_last, to_channels_last
from speedkit.algorithms.label_smoothing import smooth_labels
from speedkit.algorithms._surgery import find_residual_blocks
from speedkit.algorithms.blurpool import apply_blurpool, blur_2d
from speedkit.algorithms.squeeze_excite import apply_squeeze_excite
from speedkit.algorithms.stochastic_depth import apply_stochastic_depth
from speedkit.algorithms.ghost_batchnorm import apply_ghost_batchnorm
from speedkit.algorithms.weight_standardization import apply_weight_standardization
from speedkit.algorithms.factorize import apply_factorization
from speedkit.algorithms.low_precision_groupnorm import apply_low_precision_groupnorm
from speedkit.algorithms.low_precision_layernorm import apply_low_precision_layernorm
from speedkit.algorithms.patch_whitening import whitening_conv_from_images, apply_patch_whitening
from speedkit.algorithms.identity_init import apply_identity_init
from speedkit.algorithms.gyro_dropout import apply_gyro_dropout
from speedkit.algorithms.mixup import mixup_batch
from speedkit.algorithms.cutmix import cutmix_batch
from speedkit.algorithms.cutout import cutout_batch
from speedkit.algorithms.colout import colout_batch
from speedkit.algorithms.randaugment import randaugment_batch
from speedkit.algorithms.augmix import augmix_batch
from speedkit.algorithms.alternating_flip import alternating_flip_mask
from speedkit.algorithms.progressive_resizing import resize_batch, progressive_scale
from speedkit.algorithms.test_time_augmentation import tta_logits
from speedkit.algorithms.data_echoing import echo_batches
from speedkit.algorithms.batch_size_warmup import batch_size_at
from speedkit.algorithms.selective_backprop import select_hardest, per_sample_loss
from speedkit.algorithms.ema import ema_update, compute_ema_smoothing
from speedkit.algorithms.swa import swa_update, update_batchnorm_statistics
from speedkit.algorithms.sam import wrap_with_sam
from speedkit.algorithms.lookahead import lookahead_sync
from speedkit.algorithms.muon import split_for_muon
from speedkit.algorithms.gradient_clipping import apply_gradient_clipping, adaptive_clip_grad_
from speedkit.algorithms.layer_freezing import freeze_layers
from speedkit.algorithms.autocast import enable_autocast
from speedkit.algorithms.torch_compile import compile_model
from speedkit.algorithms.budget_schedule import make_budget_schedule
from speedkit.algorithms.rotary_embeddings import apply_rotary_embeddings, apply_rotary
from speedkit.algorithms.alibi import apply_alibi, alibi_bias
from speedkit.algorithms.qk_norm import apply_qk_norm
from speedkit.algorithms.relu_squared import apply_relu_squared
from speedkit.algorithms.gated_linear_units import apply_gated_linear_units
from speedkit.algorithms.seq_length_warmup import truncate_sequences, seq_length_at
from speedkit.algorithms._attention import find_attention_modules, intercept_attention, remove_interception

__all__ = [
    "apply_channels_last", "to_channels_last", "smooth_labels", "find_residual_blocks", "apply_blurpool",
    "blur_2d", "apply_squeeze_excite", "apply_stochastic_depth", "apply_ghost_batchnorm",
    "apply_weight_standardization", "apply_factorization", "apply_low_precision_groupnorm",
    "apply_low_precision_layernorm", "whitening_conv_from_images", "apply_patch_whitening",
    "apply_identity_init", "apply_gyro_dropout", "mixup_batch", "cutmix_batch", "cutout_batch",
    "colout_batch", "randaugment_batch", "augmix_batch", "alternating_flip_mask", "resize_batch",
    "progressive_scale", "tta_logits", "echo_batches", "batch_size_at", "select_hardest", "per_sample_loss",
    "ema_update", "compute_ema_smoothing", "swa_update", "update_batchnorm_statistics", "wrap_with_sam",
    "lookahead_sync", "split_for_muon", "apply_gradient_clipping", "adaptive_clip_grad_", "freeze_layers",
    "enable_autocast", "compile_model", "make_budget_schedule", "apply_rotary_embeddings", "apply_rotary",
    "apply_alibi", "alibi_bias", "apply_qk_norm", "apply_relu_squared", "apply_gated_linear_units",
    "truncate_sequences", "seq_length_at", "find_attention_modules", "intercept_attention",
    "remove_interception",
]
