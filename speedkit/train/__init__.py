"""Training: the loop (``trainer.py``) and what it is built from and guarded by.

``trainer.py`` the Trainer, whose every step is a named event; ``step.py`` the step's events in order and
its clock, which the Trainer and every host drive, and the stopwatch of training time; ``parts.py`` turns
what a user passes into the parts it runs (loss, evaluators, callbacks, optimizers, schedules, the record
and its logger);
``checks.py`` refuses bad arguments and a first batch that does not fit the model; ``interrupts.py``
SIGTERM and Ctrl-C; ``microbatching.py`` and ``batches.py`` how batches are split, moved and counted;
``checkpoint.py`` and ``storage.py`` checkpoint files, local and remote; ``parallel.py`` DDP and FSDP2 plans.
"""
