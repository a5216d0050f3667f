"""`dpkeras env`: versions, devices, what `dpkeras.scope()` would use and why, and every
setting (`dpkeras._config`) with where it came from."""

import argparse
import importlib.metadata
import os
import platform
import sys

from dpkeras import _cli

# Environment variables besides DPKERAS_* that change what `dpkeras env` reports.
_RELATED_ENV = (
    "CUDA_VISIBLE_DEVICES",
    "TF_CPP_MIN_LOG_LEVEL",
    "TF_FORCE_GPU_ALLOW_GROWTH",
    "TF_GPU_ALLOCATOR",
    "KERAS_BACKEND",
    "XLA_FLAGS",
)


def _version(package):
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _setting_lines(settings, variables):
    """One line per setting of a `dpkeras._config.Config`: its value and where it came from."""
    width = max(len(name) for name in variables)
    lines = []
    for name, variable in variables.items():
        value, source, text = getattr(settings, name), settings.source(name), settings.text(name)
        shown = f"{value!r}  "
        if text is not None:
            shown = "" if value == text else shown  # the text itself (TF_CONFIG): once
            source = f"from {variable}={text.strip()}"
        elif source == "default":
            source = f"default: ${variable} unset"
        lines.append(f"{name:<{width}}  {shown}({source})")
    return lines


def env(argv=None, out=None):
    """`dpkeras env`: prints what a bug report needs; returns the exit status."""
    out = out or sys.stdout
    parser = argparse.ArgumentParser(
        prog="dpkeras env",
        description="Print versions, devices, the devices dpkeras.scope() would use and why, "
        "and every setting (argument, DPKERAS_* environment variable or default) with where "
        "it came from.",
    )
    parser.add_argument(
        "--simulate_cpu_devices",
        type=int,
        default=None,
        metavar="N",
        help="split the CPU into N logical devices first, as "
        "dpkeras.simulate_cpu_devices(N) would (default: do not)",
    )
    parser.add_argument(
        "--cluster",
        default=None,
        metavar="JSON_OR_FILE",
        help="also connect to this cluster (a JSON object or file, as for "
        "dpkeras serve; default: $TF_CONFIG's, if any) and show its "
        "tasks, their devices and where variables would go",
    )
    _cli.add_verbose_argument(parser)
    args = parser.parse_args(argv)

    import dpkeras
    from dpkeras import _config as config
    from dpkeras import _device_names as device_names
    from dpkeras._cli.serve import load_cluster
    from dpkeras._extended import devices
    from dpkeras.cluster import _connect, _devices, _spec

    try:
        settings = config.resolve()
        spec = _spec.resolve_cluster(None if args.cluster is None else load_cluster(args.cluster))
    except ValueError as e:
        parser.error(str(e))

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
    say(
        f"TensorFlow {tf.__version__} (built with CUDA: {tf.test.is_built_with_cuda()}), "
        f"Keras {keras.__version__} (backend {keras.config.backend()}), "
        f"absl-py {_version('absl-py')}, numpy {_version('numpy')}"
    )
    say(f"Platform {platform.platform()}, {os.cpu_count()} CPU cores")
    say()
    say("Physical devices:")
    for d in tf.config.list_physical_devices():
        say(f"  {d.name} ({d.device_type})")
    if spec is not None:
        say("Cluster (no authentication or encryption: private networks only):")
        try:
            _connect.connect(spec, timeout=30)
        except (TimeoutError, RuntimeError) as e:
            say(f"  not connected: {e}")
            spec = None
        else:
            spec = _connect.connected_cluster()  # a resolved Cluster, read from here on
            for task, names in _devices.task_devices(spec).items():
                kinds = ", ".join(device_names.short_device(n).rsplit("/", 1)[1] for n in names)
                say(f"  {task} at {spec.tasks[task]}: {kinds}")
        say()
    say("Logical devices:")
    for d in tf.config.list_logical_devices():
        say(f"  {device_names.short_device(d.name)}  ({d.name})")
    say()
    say("dpkeras.scope() with no arguments would use:")
    try:
        resolved = devices.resolve_devices(settings, spec)
    except ValueError as e:
        say(f"  nothing: {e}")
    else:
        compute, policy, home, reason = resolved
        say(f"  compute devices:  {', '.join(device_names.short_device(d) for d in compute)}")
        say(f"  parameter device: {policy!r} (reductions on {device_names.short_device(home)})")
        say(f"  because:          {reason}")
    say()
    say("Settings (the argument, else the environment variable, else the default):")
    for line in _setting_lines(settings, config.VARIABLES):
        say(f"  {line}")
    others = config.other_variables()
    if others:
        say("Other DPKERAS_* variables (no dpkeras setting: a typo?):")
        for name, value in others.items():
            say(f"  {name}={value}")
    related = {k: os.environ[k] for k in _RELATED_ENV if k in os.environ}
    if related:
        say("Related environment:")
        for name, value in related.items():
            say(f"  {name}={value}")
    return 0
