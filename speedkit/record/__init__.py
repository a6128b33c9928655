"""What a run leaves behind: its RunRecord (``runs.py``), the loggers that write it out (``loggers.py``) and
the evaluation metrics whose values it holds (``metrics.py``)."""
from speedkit.record.runs import RunRecord

__all__ = ["RunRecord"]
