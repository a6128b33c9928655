"""Experiments over many runs: comparing them (``compare.py``), the time-to-accuracy benchmark (``bench/``)
and the measured recipe search (``tune/``)."""
