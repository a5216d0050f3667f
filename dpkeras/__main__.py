"""`python -m dpkeras <command>`: the same as the `dpkeras` console script."""

import sys

from dpkeras._cli import main

sys.exit(main())
