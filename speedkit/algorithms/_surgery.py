"""Model surgery helpers shared by methods: find modules by structure and replace them, with a report."""
from __future__ import annotations

from typing import Callable, Iterator

import torch.nn as nn

from speedkit.core.algorithm import SurgeryReport


def named_children_recursive(model: nn.Module) -> Iterator[tuple[str, nn.Module, str, nn.Module]]:
    """(parent name, parent, child attribute, child) for every module below ``model``, parents first."""
    for parent_name, parent in model.named_modules():
        for attr, child in parent.named_children():
            yield parent_name, parent, attr, child


def replace_modules(model: nn.Module, matches: Callable[[str, nn.Module], bool],
                    build: Callable[[str, nn.Module], nn.Module], report: SurgeryReport, kind: str) -> SurgeryReport:
    """Replace every module for which ``matches(full_name, module)`` with ``build(full_name, module)``.

    Matching is by structure (a predicate over the module), never by one library's classes. The
    replacement keeps the attribute name, so state dicts keep their keys where the new module has the
    same parameters. Modules inside a replaced module are not visited again.
    """
    targets = []
    replaced_prefixes: list[str] = []
    for parent_name, parent, attr, child in list(named_children_recursive(model)):
        full = f"{parent_name}.{attr}" if parent_name else attr
        if any(full.startswith(p + ".") for p in replaced_prefixes):
            continue
        if matches(full, child):
            targets.append((parent, attr, full, child))
            replaced_prefixes.append(full)
    for parent, attr, full, child in targets:
        new = build(full, child)
        setattr(parent, attr, new)
        report.add(kind, f"{full}: {type(child).__name__} -> {type(new).__name__}")
    return report
