"""Count the times a run makes the host wait on the device, on any device, a CPU included.

On a GPU the host queues work and runs ahead; every read of a device value (``.item()``, ``bool(t)``,
``float(t)``, ``if t:``, ``.tolist()``, ``.cpu()``), every device synchronize and every collective makes it
wait until the queue drains, and the GPU then idles while the host queues the next step. A CPU runs each
op at once, so these waits cost nothing there and a profile cannot show them; counted, they can be:

- reads: a ``TorchDispatchMode`` sees ``aten._local_scalar_dense`` (what ``.item()`` and ``bool()`` dispatch
  to) and copies from a device to the host; speedkit's own deliberate reads (``core.devices.to_host``) and
  synchronizes (``core.devices.synchronize``) report themselves, so they count on a CPU too;
- collectives: the ``c10d`` ops (all-reduce, broadcast, ...), counted beside the reads;
- shapes read from the data (``data_dependent``): ``nonzero``, ``unique``, ``masked_select``, indexing with a
  boolean mask, ``repeat_interleave`` of counts: the output's size is known only once the device has computed it,
  so the host waits for it;
- blocking host-to-device copies (``host_to_device``): a tensor made on the host (from Python numbers, numpy,
  or torch's CPU random generator) copied to the device without ``non_blocking`` from pinned memory, explicitly
  (``.to(device)``, ``.cuda()``, ``copy_``, ``torch.tensor(data, device=...)``) or by using it as an index or
  operand of a device op (``x[host_index]``). On a GPU the host waits for such a copy before it queues more.

On a CPU the device and the host are one, so a copy is invisible to the dispatcher (``.to(device)`` of a CPU
tensor does nothing). The counter therefore follows where each tensor was made, at the level of torch's
Python API (a ``TorchFunctionMode``): a tensor made by a factory without a ``device`` argument, from host data,
or only from such tensors is host-made, as is one placed on the device named by the string ``"cpu"`` (torch.optim's
step counts); the CPU stands in for the device everywhere else, until a tensor on another device is seen, from when
on the device is that one. ``torch.from_numpy`` is not seen (it takes no part in torch's Python API's overrides):
``torch.as_tensor`` is. A read (``.item()``) of a host-made value waits on
nothing: it is counted apart, as ``host_only``, with the reads made while a host loader makes its batch.

Use it around anything, ``with SyncCounter() as syncs: trainer.fit()``, or as a profiling callback,
``Trainer(..., callbacks=[SyncCounter()])``, which attributes each wait to the training step (from loading
its batch to its checkpoint point), the evaluation or the set-up it happened in, and writes
``record.notes["syncs"]``. ``report()`` says how many waits there were per step between logging steps
(the fast loop has none), per logging step and per evaluation. While it counts, a compiled model runs eager (a
dispatch mode keeps TorchDynamo from compiling): the count is of the eager step's ops, and the model compiles
once the count is done.
"""
from __future__ import annotations

import collections
import functools
import os
import sys
import traceback

import torch
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.weak import WeakIdKeyDictionary

from speedkit.core import devices
from speedkit.core.engine import Callback

# what counts as a wait; "host_only" (reads of values on the host) is counted apart
KINDS = ("item", "host_read", "device_sync", "collective", "host_to_device", "data_dependent")
_COLLECTIVE_NAMESPACES = ("c10d", "_c10d_functional", "c10d_functional")
# Non-view ops that give the device no work: a view in all but name (and in place), allocations (from the caching
# allocator, on the host) and reads of a value (a quiet step reads none of the device's; a read that does is a wait,
# counted).
_NO_KERNEL = frozenset({torch.ops.aten._unsafe_view.default, torch.ops.aten.as_strided_.default,
                        torch.ops.aten.resize_.default, torch.ops.aten.empty.memory_format,
                        torch.ops.aten.empty_strided.default, torch.ops.aten.empty_like.default,
                        torch.ops.aten.new_empty.default, torch.ops.aten.new_empty_strided.default,
                        torch.ops.aten._local_scalar_dense.default})


def launches_a_kernel(func) -> bool:
    """Whether an aten op gives the device work: about one kernel launch on a GPU. Views (``view``, ``t``,
    ``detach``, slices) change only a tensor's metadata, on the host, and the profiler's markers do nothing."""
    return not (func.is_view or func in _NO_KERNEL or func.namespace == "profiler")


# Multi-tensor ops: a list of tensors in one op; the foreach ones fall back to an op per tensor off CUDA's fast path.
_FOREACH_OPS = ("aten::_foreach_", "aten::_amp_foreach_")
_MULTI_TENSOR_OPS = (*_FOREACH_OPS, "aten::_fused_")


# Matrix products that add to a tensor, ``beta * self + alpha * (mat1 @ mat2)``. Into a new result, CUDA first copies
# ``self`` into it (baddbmm's and addbmm's shared checks, addmm's and addmv's CUDA kernels), a kernel of its own
# before the product's, unless addmm adds a bias vector, which cuBLASLt adds in the product's epilogue. In place,
# ``self`` is the result and nothing is copied.
_GEMMS_INTO_A_COPY = ("aten::addmm", "aten::baddbmm", "aten::addbmm", "aten::addmv")
_GEMMS = ("aten::mm", "aten::bmm", "aten::mv", "aten::dot", *_GEMMS_INTO_A_COPY)


def kernel_launches(func, args=(), kwargs=None) -> int:
    """About how many kernels an aten op launches on a GPU: none for views, allocations and reads of a value, one
    for most ops, two for a matrix product that adds to a copy of a tensor (``_GEMMS_INTO_A_COPY``), and for a
    multi-tensor op one where CUDA's fast path takes its lists (``foreach_fast_path``) and one per tensor where CUDA
    falls back to a loop of single-tensor ops, as a CPU always does."""
    if not launches_a_kernel(func):
        return 0
    name = func.name()
    if name in _GEMMS_INTO_A_COPY:
        return 2 if _copies_what_it_adds_to(name, args, kwargs or {}) else 1
    if name.startswith(_FOREACH_OPS):
        lists = [a for a in args if isinstance(a, (list, tuple)) and a and isinstance(a[0], torch.Tensor)]
        # the operand after the lists: a number or a 0-dim tensor (the AMP check's are flags, not operands)
        after = args[len(lists)] if len(args) > len(lists) and name.startswith("aten::_foreach_") else None
        scalar = after if isinstance(after, (int, float)) or (isinstance(after, torch.Tensor) and after.dim() == 0) \
            else None
        if lists and not foreach_fast_path(lists, scalar):
            return len(lists[0])
    return 1


def _copies_what_it_adds_to(name: str, args: tuple, kwargs: dict) -> bool:
    """Whether CUDA copies ``self`` into the result of ``self + mat1 @ mat2`` (``_GEMMS_INTO_A_COPY``) in a kernel of
    its own: not where beta is 0 (self is not read), where the result is self, or where addmm adds a bias vector."""
    self = args[0]
    if kwargs.get("beta", 1) == 0 or kwargs.get("out") is self:
        return False
    return not (name == "aten::addmm" and self.dim() == 1)


def foreach_fast_path(lists: list, scalar=None) -> bool:
    """Whether CUDA runs a multi-tensor op on ``lists`` (and an optional ``scalar``: a number, or a 0-dim tensor
    of the scalar-tensor overload) as one kernel (ATen's ``check_fast_path_restrictions``): every tensor on one
    device, of one dtype, dense without overlaps, the tensors at each position of one size and stride, and a result
    of the tensors' dtype. Otherwise it runs one op per tensor: a transposed or sliced view, or a bf16 update added
    to fp32 weights, turns one launch into a launch per tensor."""
    first = lists[0][0]
    for tensors in lists:
        for tensor, leader in zip(tensors, lists[0]):
            if (tensor.device != first.device or tensor.dtype != first.dtype or tensor.layout != torch.strided
                    or tensor.shape != leader.shape or not _dense(tensor) or not _same_strides(tensor, leader)):
                return False
    if isinstance(scalar, torch.Tensor):
        return scalar.dtype == first.dtype
    return scalar is None or torch.result_type(first, scalar) == first.dtype


def profiled_kernels(events) -> collections.Counter:
    """The kernels in a CPU profile (torch.profiler's events) as a GPU would launch them, by name: torch.compile's
    C++ kernels (profiled where inductor's ``cpp.enable_kernel_profile`` is on; counted as ``"inductor"``), a
    multi-tensor op once (a CPU runs one op per tensor under it, CUDA one kernel on its fast path), a matrix product
    and the copy CUDA makes of what it adds to (``_GEMMS_INTO_A_COPY``), and each other op that gives the device work
    (``launches_a_kernel``) and calls none that does (``aten::to`` calls ``copy_``): what the eager count
    (``kernel_launches``) sees, and what runs inside compiled graphs, which a dispatch mode cannot see."""
    counts: collections.Counter = collections.Counter()
    for event in events:
        if not _under_multi_tensor_op(event) and (
                event.name.startswith(_MULTI_TENSOR_OPS) or event.name.removesuffix("_") in _GEMMS
                or (_gives_work(event.name) and not _work_below(event) and not _folded_into_a_gemm(event))):
            counts["inductor" if "cpp_fused" in event.name else event.name] += 1
    return counts


def _folded_into_a_gemm(event) -> bool:
    """Whether ``event`` is a matrix product's copy of what it adds to that CUDA does not make: onto itself (the
    product in place) or of a bias vector (broadcast by ``expand``; cuBLASLt adds it in the product's epilogue). A
    CPU's product is no op of its own: its copy is all a CPU profile shows of it."""
    parent = event.cpu_parent
    if event.name != "aten::copy_" or parent is None or parent.name.removesuffix("_") not in _GEMMS_INTO_A_COPY:
        return False
    return parent.name.endswith("_") or any(child.name == "aten::expand" for child in parent.cpu_children)


def _under_multi_tensor_op(event) -> bool:
    parent = event.cpu_parent
    while parent is not None:
        if parent.name.startswith(_MULTI_TENSOR_OPS):
            return True
        parent = parent.cpu_parent
    return False


def _work_below(event) -> bool:
    return any(_gives_work(child.name) or _work_below(child) for child in event.cpu_children)


@functools.cache
def _gives_work(name: str) -> bool:
    """Whether a profiled event of this name is an aten op that launches a kernel (every overload of it does) or an
    inductor kernel."""
    if "cpp_fused" in name:
        return True
    namespace, _, op = name.partition("::")
    if namespace != "aten" or op == "item":  # item reads a value (its _local_scalar_dense launches nothing)
        return False
    packet = getattr(torch.ops.aten, op, None)
    return packet is None or all(launches_a_kernel(getattr(packet, overload)) for overload in packet.overloads())


def _dense(tensor: torch.Tensor) -> bool:
    """Whether ``tensor``'s elements fill its storage span with no gaps or overlaps, in some order of its dims."""
    expected = 1
    for size, stride in sorted(((n, s) for n, s in zip(tensor.shape, tensor.stride()) if n != 1),
                               key=lambda size_stride: size_stride[1]):
        if stride != expected:
            return False
        expected *= size
    return True


def _same_strides(tensor: torch.Tensor, leader: torch.Tensor) -> bool:
    return all(n == 1 or a == b for n, a, b in zip(tensor.shape, tensor.stride(), leader.stride()))


class _SyncDispatch(TorchDispatchMode):
    """Sees every aten op run while active; tells the counter about the ones that make the host wait."""

    def __init__(self, counter: "SyncCounter"):
        super().__init__()
        self.counter = counter

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.counter.count_op(func, args, kwargs)
        if func is torch.ops.aten._local_scalar_dense.default:
            if self.counter.host_made(args[0]):
                self.counter.count("host_only")
            elif not _reads_host_resident_value(args[0]):
                self.counter.count("item")
        elif func.namespace in _COLLECTIVE_NAMESPACES:
            self.counter.count("collective")
        elif _shape_from_data(func, args, kwargs) and not all(self.counter.host_made(t) for t in _tensors(args)):
            self.counter.count("data_dependent")
        elif func in (torch.ops.aten._to_copy.default, torch.ops.aten.copy_.default) and _device_to_host(
                func, args, kwargs):
            self.counter.count("host_read")
        return func(*args, **kwargs)


_DATA_DEPENDENT_SHAPES = (torch.ops.aten.nonzero.default, torch.ops.aten.masked_select.default,
                          torch.ops.aten._unique2.default, torch.ops.aten.unique_dim.default,
                          torch.ops.aten.unique_consecutive.default, torch.ops.aten.repeat_interleave.Tensor)
_MASK_INDEXING = (torch.ops.aten.index.Tensor, torch.ops.aten.index_put.default, torch.ops.aten.index_put_.default)


def _tensors(args) -> list[torch.Tensor]:
    return [t for t in pytree.tree_leaves(args) if isinstance(t, torch.Tensor)]


def _shape_from_data(func, args, kwargs) -> bool:
    """Whether ``func``'s output size depends on its input's values (a boolean mask as an index included)."""
    if func in _DATA_DEPENDENT_SHAPES:
        return True
    if func not in _MASK_INDEXING or not any(t.dtype in (torch.bool, torch.uint8) for t in _tensors(args[1])):
        return False
    return not (func is not torch.ops.aten.index.Tensor and _a_masked_fill(args, kwargs))


def _a_masked_fill(args, kwargs) -> bool:
    """``x[mask] = number``: ATen runs it as ``masked_fill_`` (no size read) when one mask is the only index, the
    value one number on the host (Python's ``__setitem__`` makes it there on CUDA too) and nothing accumulates."""
    indices, value = args[1], args[2]
    accumulate = args[3] if len(args) > 3 else kwargs.get("accumulate", False)
    masks = [t for t in indices if t is not None]
    return (not accumulate and len(masks) == 1 and value.numel() == 1 and value.device.type == "cpu"
            and masks[0].device == args[0].device)


# torch's calls that copy tensors or host data to a device they are told
_MOVES = (torch.Tensor.to, torch.Tensor.cuda, torch.Tensor.copy_)
_FROM_DATA = (torch.tensor, torch.as_tensor, torch.asarray, torch.Tensor.new_tensor)


class _HostCopies(TorchFunctionMode):
    """Sees every call of torch's Python API while active: follows which tensors were made on the host and tells
    the counter about each blocking copy of one to the device (see the module's docstring)."""

    def __init__(self, counter: "SyncCounter"):
        super().__init__()
        self.counter = counter
        self.host = WeakIdKeyDictionary()  # tensors made on the host while counting
        self.device_seen = False  # a tensor on a device other than the CPU went through: the CPU is the host

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        inputs = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        if not self.device_seen and any(t.device.type not in ("cpu", "meta") for t in inputs):
            self.device_seen = True
        if self._blocking_copy(func, args, kwargs, inputs):
            self.counter.count("host_to_device")
        out = func(*args, **kwargs)
        made_on_host = self._made_on_host(func, args, kwargs, inputs)
        if made_on_host is not None:
            for tensor in pytree.tree_leaves(out):
                if isinstance(tensor, torch.Tensor) and tensor.device.type == "cpu":
                    if made_on_host:
                        self.host[tensor] = True
                    else:  # on a CPU run a move to the device returns the tensor itself: now the device's
                        self.host.pop(tensor, None)
        return out

    def is_host(self, tensor: torch.Tensor) -> bool:
        if tensor.device.type != "cpu":
            return False
        return self.device_seen or tensor in self.host

    def _place(self, target) -> str | None:
        """Where a device argument (a device, its name, or a tensor) puts a tensor: "host", "device", or None
        where none is given. The name "cpu" is the host; a CPU device given otherwise (``x.device``) is the
        device on a CPU run."""
        if target is None:
            return None
        if isinstance(target, torch.Tensor):
            return "host" if self.is_host(target) else "device"
        if isinstance(target, str) and target == "cpu":
            return "host"
        if torch.device(target).type == "cpu":
            return "host" if self.device_seen else "device"
        return "device"

    def _made_on_host(self, func, args, kwargs, inputs) -> bool | None:
        """Whether ``func``'s outputs are on the host; None: leave them as they were (an in-place copy)."""
        if func is torch.Tensor.copy_:
            return None
        if func in _MOVES or func in _FROM_DATA:
            place = self._place(_copy_parts(func, args, kwargs)[1])
            if place is not None:
                return place == "host"
        elif "device" in kwargs and kwargs["device"] is not None:
            return self._place(kwargs["device"]) == "host"
        if inputs:
            return all(self.is_host(t) for t in inputs)
        return True  # a factory (randperm, rand, tensor(data)) without a device: the host's

    def _blocking_copy(self, func, args, kwargs, inputs) -> bool:
        if func in _MOVES or func in _FROM_DATA:
            source, target, non_blocking = _copy_parts(func, args, kwargs)
            if self._place(target) != "device":
                return False
            if not isinstance(source, torch.Tensor):  # Python numbers, lists, numpy arrays
                return True
            pinned = source.is_pinned() if self.device_seen else True  # a CPU run has no pinned memory
            return self.is_host(source) and not (non_blocking and pinned)
        # a host-made tensor with elements (a 0-d one is read as a number) used by an op on device tensors
        return (any(t.dim() > 0 and self.is_host(t) for t in inputs)
                and any(not self.is_host(t) for t in inputs))


def _copy_parts(func, args, kwargs) -> tuple:
    """(source, target, non_blocking) of a copy: ``Tensor.to``, ``.cuda``, ``.copy_`` (its target the tensor copied
    into) or ``torch.tensor``-like (its source the data); the target as given (a device, its name or a tensor), or
    None where the call names none."""
    if func is torch.Tensor.copy_:
        return args[1], args[0], bool(args[2] if len(args) > 2 else kwargs.get("non_blocking", False))
    if func is torch.Tensor.new_tensor:
        return args[1] if len(args) > 1 else kwargs.get("data"), kwargs.get("device", args[0]), False
    if func in _FROM_DATA:
        return args[0] if args else kwargs.get("data", kwargs.get("obj")), kwargs.get("device"), False
    non_blocking = bool(kwargs.get("non_blocking", False))
    if func is torch.Tensor.cuda:
        device = args[1] if len(args) > 1 else kwargs.get("device")
        return args[0], torch.device("cuda" if device is None else device), non_blocking
    target = kwargs.get("device", kwargs.get("other"))
    for arg in args[1:]:
        if isinstance(arg, (str, torch.device, torch.Tensor)):
            target = arg
        elif isinstance(arg, bool):
            non_blocking = arg
            break
    return args[0], target, non_blocking


def _reads_host_resident_value(tensor: torch.Tensor) -> bool:
    """Whether this read costs nothing on any device: torch.optim keeps an optimizer's step count on the
    CPU (unless ``capturable``) precisely so that reading it (``_get_value``) never waits on a GPU."""
    if tensor.device.type != "cpu" or tensor.numel() != 1:
        return False
    frame = sys._getframe(2)
    for _ in range(6):
        if frame is None:
            return False
        if frame.f_code.co_name == "_get_value" and frame.f_code.co_filename.endswith(_OPTIMIZER_FILE):
            return True
        frame = frame.f_back
    return False


_OPTIMIZER_FILE = os.path.join("torch", "optim", "optimizer.py")


def _device_to_host(func, args, kwargs) -> bool:
    if func is torch.ops.aten.copy_.default:
        target, source = args[0], args[1]
        return target.device.type == "cpu" and source.device.type != "cpu"
    source, target = args[0], kwargs.get("device")
    return target is not None and torch.device(target).type == "cpu" and source.device.type != "cpu"


def makes_batches_on_host(loader) -> bool:
    """Whether ``loader`` makes its batches on the host, outside the step's work for the device. A torch DataLoader
    does (per-image transforms read their random numbers with .item() on CPU tensors, and each epoch's iterator draws
    its worker seed so: reads that wait on nothing, on any device), and so does a loader that wraps one and says so
    (the streaming loaders). A loader of device tensors (speedkit's in-memory one) makes them in the step."""
    return isinstance(loader, torch.utils.data.DataLoader) or getattr(loader, "makes_batches_on_host", False)


class SyncCounter(Callback):
    """Counts host-device waits: a context manager, and a callback that attributes them to phases of a run.

    ``keep_stacks`` keeps where in the code each wait of a training step came from (the last few frames),
    so a regression names its line: ``counter.stacks``.
    """

    def __init__(self, keep_stacks: bool = False):
        self.keep_stacks = keep_stacks
        self.totals: collections.Counter = collections.Counter()
        self.steps: dict[int, int] = {}  # batch number (1-based) -> waits in that training step
        self.step_ops: dict[int, int] = {}  # batch number -> aten ops dispatched in that step
        self.step_launches: dict[int, int] = {}  # batch number -> the kernels its ops launch on a GPU
        self.boundary_steps: set[int] = set()  # steps that logged or were followed by an evaluation
        self.evals: list[int] = []  # waits in each evaluation
        self.phase: tuple = ("setup",)
        self.stacks: list[tuple[tuple, str]] = []
        self._mode: _SyncDispatch | None = None
        self._copies: _HostCopies | None = None
        self._stance = None  # TorchDynamo's stance while counting (eager), and the one before it
        self._entered_by_fit = False

    # -- counting ---------------------------------------------------------------------------------
    def count(self, kind: str) -> None:
        where = self.phase
        if kind == "host_only" or (where[0] == "host_data" and kind == "item"):
            self.totals["host_only"] += 1
            return
        self.totals[kind] += 1
        if where[0] == "step":
            self.steps[where[1]] = self.steps.get(where[1], 0) + 1
        elif where[0] == "eval":
            self.evals[where[1]] += 1
        if self.keep_stacks and where[0] == "step":
            self.stacks.append((where, "".join(traceback.format_stack(limit=8)[:-2])))

    def count_op(self, func, args=(), kwargs=None) -> None:
        if self.phase[0] == "step":
            step = self.phase[1]
            self.step_ops[step] = self.step_ops.get(step, 0) + 1
            self.step_launches[step] = self.step_launches.get(step, 0) + kernel_launches(func, args, kwargs)

    @property
    def total(self) -> int:
        return sum(n for kind, n in self.totals.items() if kind != "host_only")

    def __enter__(self) -> "SyncCounter":
        if self._mode is not None:
            raise RuntimeError("this SyncCounter is already counting; use one per block")
        # A dispatch mode keeps TorchDynamo from compiling, so a compiled model runs eager while counted; said so
        # here, or TorchDynamo skips the frames it first meets under the mode (on torch 2.11 for good), and the
        # model stays eager after the count too.
        self._stance = torch.compiler.set_stance("force_eager")
        self._mode = _SyncDispatch(self)
        self._copies = _HostCopies(self)
        self._copies.__enter__()
        self._mode.__enter__()
        devices.SYNC_LISTENERS.append(self.count)
        return self

    def __exit__(self, *exc) -> None:
        if self._mode is None:
            return
        devices.SYNC_LISTENERS.remove(self.count)
        mode, self._mode = self._mode, None
        copies, self._copies = self._copies, None
        mode.__exit__(*exc)
        copies.__exit__(*exc)
        stance, self._stance = self._stance, None
        stance.__exit__(*exc)

    def host_made(self, tensor: torch.Tensor) -> bool:
        """Whether ``tensor`` was made on the host while counting (reading it waits on nothing)."""
        return self._copies is not None and tensor.device.type == "cpu" and tensor in self._copies.host

    # -- as a callback: which phase of the run each wait belongs to ---------------------------------
    def fit_start(self, state, logger):
        if self._mode is None:
            self.__enter__()
            self._entered_by_fit = True
        self.phase = ("setup",)

    def before_dataloader(self, state, logger):
        batch = state.timestamp.batch + 1
        self.steps.setdefault(batch, 0)
        self.phase = ("host_data", batch) if makes_batches_on_host(state.train_dataloader) else ("step", batch)

    def after_dataloader(self, state, logger):
        self.phase = ("step", state.timestamp.batch + 1)

    def batch_end(self, state, logger):
        if state.timestamp.batch % state.log_every == 0 or state.is_done():
            self.boundary_steps.add(state.timestamp.batch)

    def eval_start(self, state, logger):
        self._before_eval = self.phase
        if self.phase[0] == "step":  # the clock stops for the evaluation: one wait there is expected
            self.boundary_steps.add(self.phase[1])
        self.evals.append(0)
        self.phase = ("eval", len(self.evals) - 1)

    def eval_end(self, state, logger):
        self.phase = getattr(self, "_before_eval", ("setup",))

    def fit_end(self, state, logger):
        logger.log_note("syncs", self.report())
        self.close()

    def close(self) -> None:
        """Stop counting if fit started it (the Trainer calls this at every ending, a failed one too)."""
        self.phase = ("end",)
        if self._entered_by_fit:
            self._entered_by_fit = False
            self.__exit__(None, None, None)

    # -- what was counted -----------------------------------------------------------------------
    def quiet_steps(self) -> dict[int, int]:
        """Waits in each training step that neither logged nor was followed by an evaluation (a step that
        saves a checkpoint counts the save's wait too). The fit's first step is left out: it checks its
        batch against the model, once (``speedkit.train.checks``); ``first_step`` in the report has it."""
        first = min(self.steps, default=None)
        return {b: n for b, n in self.steps.items() if b not in self.boundary_steps and b != first}

    def quiet_step_ops(self) -> dict[int, int]:
        """Aten ops dispatched in each quiet training step (see ``quiet_steps``): the host's work to queue it."""
        return {b: self.step_ops.get(b, 0) for b in self.quiet_steps()}

    def quiet_step_launches(self) -> dict[int, int]:
        """The kernels a GPU would launch for each quiet step's ops (``kernel_launches``): one for each op that gives
        the device work, one per tensor for a multi-tensor op off CUDA's fast path."""
        return {b: self.step_launches.get(b, 0) for b in self.quiet_steps()}

    def report(self) -> dict:
        quiet = self.quiet_steps()
        logged = [self.steps.get(b, 0) for b in sorted(self.boundary_steps)]
        first = min(self.steps, default=None)
        return {"total": self.total, "by_kind": dict(self.totals), "steps": len(self.steps),
                "first_step": self.steps.get(first, 0),
                "waits_in_quiet_steps": sum(quiet.values()),
                "steps_with_waits": sorted(b for b, n in quiet.items() if n),
                "max_per_boundary_step": max(logged, default=0),
                "per_evaluation": list(self.evals)}
