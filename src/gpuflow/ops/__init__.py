"""Operator tools: plan, status, doctor, probe, config-doc; the Snakemake adapter.

The GPU acceptance check (`make gpu-check`) is no part of the package: benchmarks/gpu_check.
"""
