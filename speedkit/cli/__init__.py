"""The front ends a person types: the ``speedkit`` command, one module per subcommand (``train.py``, ``bench.py``,
``export.py``, ...) that ``main.py`` builds the parser from and dispatches to, and the notebook runner it calls."""
