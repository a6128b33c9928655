"""The front ends a person types: the ``speedkit`` command (``main.py``), the demo, the notebook runner and
the weight export it calls."""
