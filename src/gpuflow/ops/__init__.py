"""Operator tools: plan, status, doctor, probe, config-doc; the Snakemake adapter."""
