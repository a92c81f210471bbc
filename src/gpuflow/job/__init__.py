"""gpuflow.job: the lifecycle every step runs inside (see `context`).

Modules: `context` (the Job a step asks for everything), `paths` (where job files live),
`state` (resume states), `unitlog` (resume logs of units finished one by one), `progress`
(progress files), `record` (the job record),
`finished_states` (states kept until the run accepts the outputs), `divergence` (NaN guard).
"""

from gpuflow.job.context import Job, current

__all__ = ["Job", "current"]
