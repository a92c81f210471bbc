"""The columns of a sweep shard's table, one row per seed."""

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
