"""The functional form of every method, for any plain PyTorch loop: ``import speedkit.functional as sf``.

Surgeries (``apply_*``) change a model in place and return a report of what they changed; batch
functions take and return tensors; helpers for your own loop (EMA, SWA, clipping) act on a model or
its parameters. Each comes from its method's module in ``speedkit.methods``, beside its card.
"""
from speedkit.methods._attention import find_attention_modules, intercept_attention, remove_interception
from speedkit.methods._surgery import find_residual_blocks
from speedkit.methods.alibi import alibi_bias, apply_alibi
from speedkit.methods.alternating_flip import alternating_flip_mask
from speedkit.methods.augmix import augmix_batch
from speedkit.methods.autocast import enable_autocast
from speedkit.methods.batch_size_warmup import batch_size_at
from speedkit.methods.blurpool import apply_blurpool, blur_2d
from speedkit.methods.budget_schedule import make_budget_schedule
from speedkit.methods.channels_last import apply_channels_last, to_channels_last
from speedkit.methods.colout import colout_batch
from speedkit.methods.cutmix import cutmix_batch
from speedkit.methods.cutout import cutout_batch
from speedkit.methods.data_echoing import echo_batches
from speedkit.methods.ema import compute_ema_smoothing, ema_update
from speedkit.methods.factorize import apply_factorization
from speedkit.methods.gated_linear_units import apply_gated_linear_units
from speedkit.methods.ghost_batchnorm import apply_ghost_batchnorm
from speedkit.methods.gradient_clipping import adaptive_clip_grad_, apply_gradient_clipping
from speedkit.methods.gyro_dropout import apply_gyro_dropout
from speedkit.methods.identity_init import apply_identity_init
from speedkit.methods.label_smoothing import smooth_labels
from speedkit.methods.layer_freezing import freeze_layers
from speedkit.methods.lookahead import lookahead_sync
from speedkit.methods.low_precision_groupnorm import apply_low_precision_groupnorm
from speedkit.methods.low_precision_layernorm import apply_low_precision_layernorm
from speedkit.methods.mixup import mixup_batch
from speedkit.methods.muon import split_for_muon
from speedkit.methods.patch_whitening import apply_patch_whitening, whitening_conv_from_images
from speedkit.methods.progressive_resizing import progressive_scale, resize_batch
from speedkit.methods.qk_norm import apply_qk_norm
from speedkit.methods.randaugment import randaugment_batch
from speedkit.methods.relu_squared import apply_relu_squared
from speedkit.methods.rotary_embeddings import apply_rotary, apply_rotary_embeddings
from speedkit.methods.sam import wrap_with_sam
from speedkit.methods.selective_backprop import per_sample_loss, select_hardest
from speedkit.methods.seq_length_warmup import seq_length_at, truncate_sequences
from speedkit.methods.squeeze_excite import apply_squeeze_excite
from speedkit.methods.stochastic_depth import apply_stochastic_depth
from speedkit.methods.swa import swa_update, update_batchnorm_statistics
from speedkit.methods.test_time_augmentation import tta_logits
from speedkit.methods.torch_compile import compile_model
from speedkit.methods.weight_standardization import apply_weight_standardization

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
