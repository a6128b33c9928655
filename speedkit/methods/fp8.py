"""fp8 training: the model's linear layers run their matmuls in float8 on GPUs with fp8 tensor cores.

torchao's float8 training (``torchao.float8.convert_to_float8_training``) swaps each eligible ``nn.Linear``
for a ``Float8Linear`` holding the very same parameters: the weights stay in their precision (the optimizer
and checkpoints see nothing new); inputs, weights and output gradients are scaled and cast to e4m3/e5m2 for
the three matmuls of each layer, with dynamic per-tensor scales. It pays where matmuls dominate and are
large: on an H100 torchao reports 1.2-1.5x end-to-end for LLaMA-class models, little for small ones, whose
time goes to the casts. It needs fp8 tensor cores (CUDA compute capability 8.9 or newer: Ada, Hopper,
Blackwell) and the ``torchao`` package (``pip install 'torch-speedkit[fp8]'``); elsewhere it is refused before
training with the reason. Eligible layers have both dimensions divisible by 16 (what the fp8 matmul
needs); the output layer (the classifier or language-model head) stays in bf16, as torchao advises.
"""
from __future__ import annotations

import importlib.util

import torch
import torch.nn as nn

from speedkit.core.event import Event
from speedkit.core.method import HParam, Method, MethodCard, SurgeryReport

MIN_CAPABILITY = (8, 9)  # fp8 tensor cores: Ada (8.9), Hopper (9.0), Blackwell (10.x)
RECIPES = ("tensorwise", "rowwise")  # torchao's scaling recipes: one scale per tensor, or per row


def fp8_refusal(device: torch.device) -> str | None:
    """Why fp8 training cannot run on ``device`` here, or None when it can."""
    if importlib.util.find_spec("torchao") is None:
        return "fp8 needs the torchao package: pip install 'torch-speedkit[fp8]' (or pip install torchao)"
    if device.type != "cuda":
        return (f"fp8 needs a CUDA GPU with fp8 tensor cores (compute capability >= 8.9: L4, L40S, RTX 40xx, H100, "
                f"H200, B200); this run's device is {device.type}. Remove fp8, or train on such a GPU")
    capability = torch.cuda.get_device_capability(device)
    if capability < MIN_CAPABILITY:
        return (f"fp8 needs compute capability >= 8.9 (fp8 tensor cores); {torch.cuda.get_device_name(device)} has "
                f"{capability[0]}.{capability[1]}. Use precision='bf16' instead")
    return None


def eligible_linears(model: nn.Module, skip_last: bool = True) -> list[str]:
    """Names of the linear layers fp8 would convert: both dimensions divisible by 16, the last one left out."""
    names = [name for name, module in model.named_modules()
             if type(module) is nn.Linear and module.in_features % 16 == 0 and module.out_features % 16 == 0]
    linears = [name for name, module in model.named_modules() if type(module) is nn.Linear]
    if skip_last and linears and names and names[-1] == linears[-1]:
        names = names[:-1]  # the output layer: its small, precision-sensitive matmul stays in bf16
    return names


def convert_to_fp8(model: nn.Module, recipe: str = "tensorwise", skip_last: bool = True,
                   allow_empty: bool = False) -> SurgeryReport:
    """Swap ``model``'s eligible ``nn.Linear`` layers for torchao ``Float8Linear`` in place; returns what changed.

    Conversion itself runs on any device (tests check it on a CPU); training with the result needs a GPU
    that ``fp8_refusal`` accepts.
    """
    if recipe not in RECIPES:
        raise ValueError(f"fp8 recipe must be one of {RECIPES}, got {recipe!r}")
    if importlib.util.find_spec("torchao") is None:
        raise ImportError(fp8_refusal(torch.device("cpu")))
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    chosen = set(eligible_linears(model, skip_last))
    report = SurgeryReport("fp8")
    if chosen:
        config = Float8LinearConfig.from_recipe_name(recipe)
        convert_to_float8_training(model, config=config, module_filter_fn=lambda module, fqn: fqn in chosen)
        for name in sorted(chosen):
            report.add("linear layers", f"{name}: Linear -> Float8Linear ({recipe})")
    return report.require_changes(allow_empty, "linear layers with both dimensions divisible by 16")


class FP8(Method):
    CARD = MethodCard(
        name="fp8",
        summary="Run the linear layers' matmuls in float8 (torchao) on GPUs with fp8 tensor cores.",
        domain="any",
        events=(Event.INIT,),
        reads=("model",),
        writes=("model",),
        hparams=(
            HParam("recipe", str, "tensorwise", choices=RECIPES,
                   help="torchao's scaling: one scale per tensor (fastest) or per row (more accurate)"),
            HParam("skip_last", bool, True, help="keep the output layer (classifier, LM head) in bf16"),
        ),
        requirements=("a CUDA GPU of compute capability >= 8.9 (L4, L40S, RTX 40xx, H100, H200, B200)",
                      "the torchao package (speedkit[fp8])", "precision='bf16' for the rest of the model",
                      "linear layers with both dimensions divisible by 16"),
        runs_after=("factorize", "gated_linear_units"),  # convert the linear layers those methods create
        effect="1.2-1.5x end-to-end on an H100 for large transformer matmuls (torchao's figures); little or "
               "nothing for small models, whose time goes to the casts",
        source="Micikevicius et al. 2022 'FP8 Formats for Deep Learning'; torchao float8 training README",
    )

    def __init__(self, recipe: str = "tensorwise", skip_last: bool = True):
        super().__init__(recipe=recipe, skip_last=skip_last)

    def match(self, event, state) -> bool:
        return event is Event.INIT

    def apply(self, event, state, logger):
        refusal = fp8_refusal(state.device)
        if refusal is not None:
            raise ValueError(f"method fp8 refused: {refusal}")
        report = convert_to_fp8(state.model, self.params["recipe"], self.params["skip_last"])
        logger.log_text(str(report))
