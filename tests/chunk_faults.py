"""A `gpuflow` whose scoring steps save each chunk no faster than a floor (used by the stop and
kill tests of perplexity and toxicity shards).

`python -m tests.chunk_faults SECONDS -- <gpuflow step arguments>` runs the real step with
each chunk (gpuflow.job.loop.Units.finished: saved, reported) waiting out the rest of SECONDS. A
tiny model scores a test's whole shard in tens of milliseconds, so a signal sent once the first
chunk is saved could arrive after the last; with the floor the rest of the shard takes at least
SECONDS per chunk, however busy the machine. The scores do not change.
"""

from __future__ import annotations

import sys

from gpuflow import cli
from gpuflow.job.loop import Units
from tests.floors import floor_method


def main(argv: list[str]) -> int:
    """Run `gpuflow` with the arguments after `--`, each chunk save floored at argv[0] s."""
    floor_method(Units, "finished", float(argv[0]))
    return cli.main(argv[argv.index("--") + 1 :])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
