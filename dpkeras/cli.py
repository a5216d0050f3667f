"""The `dpkeras` command.

    dpkeras env [--simulate_cpu_devices N]   versions, devices and what dpkeras.scope() picks
    dpkeras bench [flags]                    the benchmark (benchmarks/compare.py); --helpfull

`dpkeras bench` runs the benchmark of the source checkout this dpkeras is installed from
(`pip install -e .`); the benchmark is not part of the installed package.
"""

import sys

from dpkeras.commands.bench import bench
from dpkeras.commands.env import env

__all__ = ["main"]

_USAGE = """usage: dpkeras <command> [options]

commands:
  env     print versions, devices, the devices dpkeras.scope() would use and why, and the
          DPKERAS_* settings (paste it into bug reports)
  bench   run the benchmark: dpkeras against MirroredStrategy, CentralStorageStrategy and
          one device (flags: dpkeras bench --helpfull)
"""


_COMMANDS = {"env": env, "bench": bench}


def main(argv=None):
    """Entry point of the `dpkeras` console script."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_USAGE, end="")
        return 0 if argv else 2
    command = _COMMANDS.get(argv[0])
    if command is None:
        print(f"dpkeras: unknown command {argv[0]!r}; valid commands: "
              f"{', '.join(_COMMANDS)}.\n\n{_USAGE}", end="", file=sys.stderr)
        return 2
    return command(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
