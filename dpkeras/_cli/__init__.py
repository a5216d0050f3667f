"""The `dpkeras` command.

    dpkeras env [--simulate_cpu_devices N]   versions, devices and what dpkeras.scope() picks
    dpkeras bench [flags]                    the benchmark (benchmarks/compare.py); --helpfull
    dpkeras serve --cluster C --job J --task I   one ps or worker task of a cluster
    dpkeras launch --ps N --workers M -- CMD     one program in every task, on this machine

`dpkeras bench` runs the benchmark of the source checkout this dpkeras is installed from
(`pip install -e .`), in a process of its own; the benchmark is not part of the installed
package, so from a wheel it refuses in one line.

One module a verb:

- `env`: versions, devices, settings, and what `dpkeras.scope()` picks;
- `bench`: the checkout's benchmark, in a process of its own;
- `serve`: one task of a cluster, until stopped or until its client finishes;
- `launch`: a loopback cluster running one program in every task.
"""

import importlib
import os
import sys

from dpkeras import _config, _quiet

_USAGE = """usage: dpkeras <command> [options]

commands:
  env     print versions, devices, the devices dpkeras.scope() would use and why, and the
          DPKERAS_* settings (paste it into bug reports)
  bench   run the benchmark: dpkeras against MirroredStrategy, CentralStorageStrategy and
          one device (flags: dpkeras bench --helpfull)
  serve   run one task (ps or worker) of a cluster until SIGTERM: --cluster (JSON file or
          string) --job --task [--cpus N], or TF_CONFIG. No authentication or encryption:
          private networks only
  launch  run one program in every task of a cluster on this machine, each with its
          TF_CONFIG (as Kubeflow's TFJob) or TF1's flags (--flags): --ps N --workers M
          [--cpus K] [--client chief|master|worker] -- python train.py; exits with the
          client's status

TensorFlow's log noise (start-up lines, cuInit, INFO and WARNING) is hidden; --verbose after
the command, or DPKERAS_VERBOSE=1, shows it.
"""


_COMMANDS = ("env", "bench", "serve", "launch")  # each the function of its module


def _take_verbose(argv):
    """`argv` without `--verbose` among the command's own arguments (before a `--`); when it
    was there, sets `$DPKERAS_VERBOSE=1` for this process and the tasks it starts."""
    own = argv[: argv.index("--")] if "--" in argv else argv
    if "--verbose" not in own:
        return argv
    os.environ[_config.VARIABLES["verbose"]] = "1"
    rest = list(argv)
    rest.remove("--verbose")
    return rest


def add_verbose_argument(parser):
    """`--verbose` in a command's help. `main` takes it out of the arguments before the command
    parses them (`_take_verbose`), so that `dpkeras bench` can pass the rest on."""
    parser.add_argument(
        "--verbose",
        action="store_true",
        help=f"show TensorFlow's log noise (default: ${_config.VARIABLES['verbose']}, else hide "
        "it: start-up lines, cuInit, INFO and WARNING)",
    )


def main(argv=None):
    """Entry point of the `dpkeras` console script."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_USAGE, end="")
        return 0 if argv else 2
    if argv[0] not in _COMMANDS:
        print(
            f"dpkeras: unknown command {argv[0]!r}; valid commands: "
            f"{', '.join(_COMMANDS)}.\n\n{_USAGE}",
            end="",
            file=sys.stderr,
        )
        return 2
    rest = _take_verbose(argv[1:])
    try:
        _quiet.filter_stderr()
    except ValueError as e:  # a bad $DPKERAS_VERBOSE
        print(f"dpkeras {argv[0]}: error: {e}", file=sys.stderr)
        return 2
    if argv[0] == "serve":  # a task never runs Keras: it starts without importing it
        from dpkeras.cluster._without_keras import refuse_keras

        refuse_keras()
    # Imported now, after the filter: the commands that import TensorFlow start quiet.
    command = getattr(importlib.import_module(f"dpkeras._cli.{argv[0]}"), argv[0])
    try:
        return command(rest)
    finally:
        _quiet.close()


if __name__ == "__main__":
    sys.exit(main())
