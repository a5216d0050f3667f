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

import sys

from dpkeras._cli import bench, env, launch, serve

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
          TF_CONFIG (as Kubeflow's TFJob): --ps N --workers M [--cpus K]
          [--client chief|master|worker] -- python train.py; exits with the client's status
"""


_COMMANDS = {
    "env": env.env,
    "bench": bench.bench,
    "serve": serve.serve,
    "launch": launch.launch,
}


def main(argv=None):
    """Entry point of the `dpkeras` console script."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_USAGE, end="")
        return 0 if argv else 2
    command = _COMMANDS.get(argv[0])
    if command is None:
        print(
            f"dpkeras: unknown command {argv[0]!r}; valid commands: "
            f"{', '.join(_COMMANDS)}.\n\n{_USAGE}",
            end="",
            file=sys.stderr,
        )
        return 2
    return command(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
