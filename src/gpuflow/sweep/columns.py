"""The columns of a sweep shard's table, one row per seed.

A module of its own, free of torch, so that reading shard tables (`gpuflow sweep-aggregate`)
does not import what computing them needs.
"""

COLUMNS = [
    "method",
    "teacher_rank",
    "student_width",
    "seed",
    "reached_threshold",
    "train_error",
    "test_error",
    "steps",
    "guesses",
    "loss_threshold",
    "n_train",
    "input_dim",
    "output_dim",
    "label_noise",
    "wall_s",
]
