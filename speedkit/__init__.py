"""speedkit: faster PyTorch training by composing proven speed-up methods."""
from speedkit.version import __version__  # noqa: E402
from speedkit.core import Algorithm, Callback, Event, MethodCard, State, Time, Timestamp  # noqa: E402
from speedkit.metrics import Evaluator  # noqa: E402
from speedkit.runs import RunRecord  # noqa: E402
from speedkit.task import DataRequest, Task  # noqa: E402
from speedkit.trainer import Trainer  # noqa: E402

__all__ = ["Algorithm", "Callback", "DataRequest", "Event", "Evaluator", "MethodCard", "RunRecord", "State", "Task",
           "Time", "Timestamp", "Trainer", "__version__"]
