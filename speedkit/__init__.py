"""speedkit: faster PyTorch training by composing proven speed-up methods."""
from speedkit.core import Callback, Event, Method, MethodCard, State, Time, Timestamp  # noqa: E402
from speedkit.record.metrics import Evaluator  # noqa: E402
from speedkit.record.runs import RunRecord  # noqa: E402
from speedkit.tasks.task import DataRequest, Task  # noqa: E402
from speedkit.train.trainer import Trainer  # noqa: E402
from speedkit.version import __version__  # noqa: E402

__all__ = ["Method", "Callback", "DataRequest", "Event", "Evaluator", "MethodCard", "RunRecord", "State", "Task",
           "Time", "Timestamp", "Trainer", "__version__"]
