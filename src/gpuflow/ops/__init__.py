"""Operator tools: plan, status, doctor, probe, gpu-check, config-doc; the Snakemake adapter."""
