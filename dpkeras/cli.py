"""The `dpkeras` command.

    dpkeras env [--simulate_cpu_devices N]   versions, devices and what dpkeras.scope() picks
    dpkeras bench [flags]                    the benchmark (benchmarks/compare.py); --helpfull

`dpkeras bench` runs the benchmark of the source checkout this dpkeras is installed from
(`pip install -e .`); the benchmark is not part of the installed package.
"""

import argparse
import importlib.metadata
import os
import platform
import sys

__all__ = ["main"]

_USAGE = """usage: dpkeras <command> [options]

commands:
  env     print versions, devices, the devices dpkeras.scope() would use and why, and the
          DPKERAS_* settings (paste it into bug reports)
  bench   run the benchmark: dpkeras against MirroredStrategy, CentralStorageStrategy and
          one device (flags: dpkeras bench --helpfull)
"""

# Environment variables besides DPKERAS_* that change what `dpkeras env` reports.
_RELATED_ENV = ("CUDA_VISIBLE_DEVICES", "TF_CPP_MIN_LOG_LEVEL", "TF_FORCE_GPU_ALLOW_GROWTH",
                "TF_GPU_ALLOCATOR", "KERAS_BACKEND", "XLA_FLAGS")


def _version(package):
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def env(argv=None, out=None):
    """`dpkeras env`: prints what a bug report needs; returns the exit status."""
    out = out or sys.stdout
    parser = argparse.ArgumentParser(
        prog="dpkeras env",
        description="Print versions, devices, the devices dpkeras.scope() would use and why, "
                    "and the DPKERAS_* settings.")
    parser.add_argument("--simulate_cpu_devices", type=int, default=None, metavar="N",
                        help="split the CPU into N logical devices first, as "
                             "dpkeras.simulate_cpu_devices(N) would (default: do not)")
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

    import dpkeras
    from dpkeras import config, devices

    if args.simulate_cpu_devices is not None:
        try:
            dpkeras.simulate_cpu_devices(args.simulate_cpu_devices)
        except (ValueError, RuntimeError) as e:
            parser.error(str(e))
    import keras
    import tensorflow as tf

    def say(text=""):
        print(text, file=out)

    say(f"dpkeras {dpkeras.__version__} ({os.path.dirname(os.path.abspath(dpkeras.__file__))})")
    say(f"Python {platform.python_version()} ({sys.executable})")
    say(f"TensorFlow {tf.__version__} (built with CUDA: {tf.test.is_built_with_cuda()}), "
        f"Keras {keras.__version__} (backend {keras.config.backend()}), "
        f"absl-py {_version('absl-py')}, numpy {_version('numpy')}")
    say(f"Platform {platform.platform()}, {os.cpu_count()} CPU cores")
    say()
    say("Physical devices:")
    for d in tf.config.list_physical_devices():
        say(f"  {d.name} ({d.device_type})")
    say("Logical devices:")
    for d in tf.config.list_logical_devices():
        say(f"  {devices.short_device(d.name)}  ({d.name})")
    say()
    say("dpkeras.scope() with no arguments would use:")
    try:
        resolved = devices.resolve_devices()
    except ValueError as e:
        say(f"  nothing: {e}")
    else:
        compute, reason = resolved[0], resolved[-1]
        say(f"  compute devices:  {', '.join(devices.short_device(d) for d in compute)}")
        if len(resolved) == 4:  # (compute, placement policy, home device, reason)
            say(f"  parameter device: {resolved[1]!r} (reductions on "
                f"{devices.short_device(resolved[2])})")
        else:  # (compute, parameter device, reason)
            say(f"  parameter device: {devices.short_device(resolved[1])}")
        say(f"  because:          {reason}")
    say()
    settings = config.env_settings()
    say("DPKERAS_* settings:" if settings else "DPKERAS_* settings: none set")
    for name, value in settings.items():
        say(f"  {name}={value}")
    related = {k: os.environ[k] for k in _RELATED_ENV if k in os.environ}
    if related:
        say("Related environment:")
        for name, value in related.items():
            say(f"  {name}={value}")
    return 0


def _checkout_root():
    """The source checkout whose `benchmarks/compare.py` `dpkeras bench` runs, or None."""
    import dpkeras

    root = os.path.dirname(os.path.dirname(os.path.abspath(dpkeras.__file__)))
    return root if os.path.isfile(os.path.join(root, "benchmarks", "compare.py")) else None


def bench(argv=None):
    """`dpkeras bench [flags]`: runs benchmarks/compare.py's main with these flags."""
    root = _checkout_root()
    if root is None:
        import dpkeras

        print(f"dpkeras bench runs the benchmark of a dpkeras source checkout, but dpkeras is "
              f"installed from {os.path.dirname(os.path.abspath(dpkeras.__file__))}, which has "
              f"no benchmarks/compare.py beside it. Clone the repository, `pip install -e .` "
              f"in it, and run `dpkeras bench` (or `python -m benchmarks.compare` there).",
              file=sys.stderr)
        return 2
    if root not in sys.path:
        sys.path.insert(0, root)
    from absl import app

    from benchmarks import compare

    main_module = sys.modules.get("__main__")
    if main_module is not None:  # absl's --help prints the __main__ module's docstring
        main_module.__doc__ = compare.__doc__
    app.run(compare.main, argv=["dpkeras bench"] + list(argv or []))
    return 0


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
