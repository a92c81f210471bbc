"""gpu-check (`python -m benchmarks.gpu_check`, `make gpu-check`): every CUDA path of gpuflow,
run once and checked against a reference; a GPU test suite that lives outside the package.

`gpuflow plan` reads only the records it writes (gpuflow.cost.records), never this code.
"""
