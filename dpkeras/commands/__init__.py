"""The verbs of the `dpkeras` command, one module each."""
