"""A visual question task generated from a seed, the model trained on it, and how answers are scored.

:mod:`~vlsens.task.questions` draws the questions (images of coloured shapes, two-image
comparisons, closed-world text questions) for the ``train``, ``calib`` and ``eval`` splits, which
are disjoint by seed; :mod:`~vlsens.task.score` normalises answers and gives accuracy with its
Wilson interval and paired comparisons; :mod:`~vlsens.task.train` trains the tiny Qwen2.5-VL
preset on the task (``make train-tiny``), which the ``tiny`` preset ships.
"""
