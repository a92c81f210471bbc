"""`gpuflow gpu-check`: every CUDA path of gpuflow, run once and checked against a reference."""
