"""Telemetry of every job: a sampler thread reads the job's GPUs (NVML) and its process tree.

The job context starts it around each step (`gpuflow.job.record`); the step's run record
(`gpuflow.job.devices.run_record`) holds the summary so far, and the job record
(`<family>/jobs/<first output>.record.json`) the final one. Reports and `gpuflow plan` read
those records (`gpuflow.job.record_tables`), flagging jobs whose utilisation is below the
configured threshold with the reason their own timings give (`flags`).
"""
