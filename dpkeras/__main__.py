"""`python -m dpkeras <command>`: the same as the `dpkeras` console script."""

import sys

from dpkeras.cli import main

sys.exit(main())
