"""speedkit's methods in training loops speedkit does not own: one engine, several hosts.

* :class:`speedkit.hosts.loop.Speedkit`: a hand-written PyTorch loop, or an Accelerate script;
* ``speedkit.hosts.lightning``: a Lightning ``Callback`` (needs ``pip install 'torch-speedkit[lightning]'``);
* ``speedkit.hosts.hf``: the Hugging Face ``Trainer`` (needs ``pip install 'torch-speedkit[hf]'``).

Every host runs the same Method objects, cards, order and conflict checks as ``speedkit.Trainer``
(through ``speedkit.core.Engine``), declares which events it can serve (:class:`speedkit.hosts.session.Host`),
refuses before training a method it cannot serve (naming the method, the host and the fix), and puts the
methods' state into its own checkpoints. The Lightning and Hugging Face adapters are imported from their
modules, so importing this package needs neither library.
"""
from speedkit.hosts._optimizers import OptimizerGroup, as_one_optimizer
from speedkit.hosts.loop import LOOP, Speedkit
from speedkit.hosts.session import Host, HostCannotServeError, MethodSession

__all__ = ["Host", "HostCannotServeError", "LOOP", "MethodSession", "OptimizerGroup", "Speedkit",
           "as_one_optimizer"]
