"""`python -m gpuflow` is `gpuflow`."""

import sys

from gpuflow.cli import main

sys.exit(main())
