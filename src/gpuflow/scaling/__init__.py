"""DDP scaling benchmarks: a transformer text classifier trained at several world sizes."""
