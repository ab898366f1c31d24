"""Training a small encoder in NumPy: optimisers, schedules, tasks, the training loop and its checkpoints.

:mod:`.optim` (AdamW, SGD, clipping, warm-up schedules), :mod:`.tasks` (synthetic tasks and masked language
modelling, with their heads), :mod:`.state` (a run's definition and starting state), :mod:`.loop` (the loop
behind the ``train`` command) and :mod:`.checkpoint` (one ``.npz`` per run, written atomically).
"""
