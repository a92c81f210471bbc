"""Operator tools: plan, status, doctor, probe, gpu-check; the one adapter to Snakemake."""
