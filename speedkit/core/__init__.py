"""The core: events, time, state, the Method base and the Engine. Imports nothing from ui or bench."""
from speedkit.core.engine import Callback, Engine
from speedkit.core.event import Event
from speedkit.core.method import (HParam, IncompatibleMethodsError, Method, MethodCard, check_compatibility,
                                  order_methods)
from speedkit.core.state import Interval, State
from speedkit.core.time import Time, Timestamp, TimeUnit

__all__ = ["Method", "Callback", "Engine", "Event", "HParam", "IncompatibleMethodsError", "Interval",
           "MethodCard", "State", "Time", "TimeUnit", "Timestamp", "check_compatibility", "order_methods"]
