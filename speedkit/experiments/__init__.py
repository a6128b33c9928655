"""Experiments over many runs: comparing them (``compare.py``), leave-one-out (``ablation.py``, which the
benchmark and the search share), the time-to-accuracy benchmark (``bench/``) and the measured recipe search
(``tune/``)."""
