"""The core: events, time, state, the Algorithm base and the Engine. Imports nothing from ui or bench."""
from speedkit.core.algorithm import (Algorithm, HParam, IncompatibleMethodsError, MethodCard, check_compatibility,
                                     order_algorithms)
from speedkit.core.engine import Callback, Engine
from speedkit.core.event import Event
from speedkit.core.state import Interval, State
from speedkit.core.time import Time, Timestamp, TimeUnit, TrainClock

__all__ = ["Algorithm", "Callback", "Engine", "Event", "HParam", "IncompatibleMethodsError", "Interval",
           "MethodCard", "State", "Time", "TimeUnit", "Timestamp", "TrainClock", "check_compatibility",
           "order_algorithms"]
