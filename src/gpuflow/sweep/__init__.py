"""The sweep family: teacher-student runs (gradient descent and guess-and-check) over seeds."""
