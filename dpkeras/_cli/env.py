"""`dpkeras env`: versions, devices, what `dpkeras.scope()` would use and why, and every
setting (`dpkeras._config`) with where it came from."""

import argparse
import importlib.metadata
import os
import platform
import sys

from dpkeras import _cli, _quiet

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


def _task_state(cluster, task, address):
    """`(what a task's line says, its device names)`, read without connecting as a client:
    a probe of its port, then its devices and its client's record (`cluster._client_record`)."""
    from dpkeras import _device_names as device_names
    from dpkeras.cluster import _client_record
    from dpkeras.cluster._health import probe

    reason = probe(address, timeout=2.0)
    if task == cluster.client[0] and task not in cluster.training:  # the chief: the client
        if reason is None:
            return "the client's task; it answers: a client is running", []
        return f"the client's task; no client is running ({reason})", []
    if reason is not None:
        return f"does not answer ({reason})", []
    reader = _client_record.RecordReader(address, task)
    try:
        names = reader.devices()
        record = reader.record()
    except Exception as e:  # it answered the probe, not the read
        return f"answers, but not a read of its devices ({type(e).__name__}: {e})", []
    finally:
        reader.close()
    kinds = ", ".join(device_names.short_device(n).rsplit("/", 1)[1] for n in names)
    if record is None:
        client = "no client has connected"
    elif record["state"] == _client_record.FINISHED:
        client = f"its last {_client_record.describe(record)} finished training"
    elif _client_record.holding(record) is None:
        client = f"its {_client_record.describe(record)} no longer answers (it did not finish)"
    elif record["state"] == _client_record.CONNECTING:
        client = f"connecting: {_client_record.describe(record)}"
    else:
        client = f"training: {_client_record.describe(record)}"
    return f"answers; {kinds}; {client}", names


def _say_devices(say, compute, policy, home, reason):
    """The three lines of what `dpkeras.scope()` would use: compute devices, parameter device
    (and where reductions run, `home`), and why."""
    from dpkeras import _device_names as device_names

    say(f"  compute devices:  {', '.join(device_names.short_device(d) for d in compute)}")
    say(f"  parameter device: {policy!r} (reductions on {device_names.short_device(home)})")
    say(f"  because:          {reason}")


def _say_cluster_defaults(say, cluster, cluster_devices, settings):
    """The devices `dpkeras.scope()` would use on the cluster by default, from the tasks'
    devices as read (`_task_state`)."""
    from dpkeras import placement
    from dpkeras.cluster import _devices

    silent = [task for task, names in cluster_devices.items() if not names]
    if silent:
        say(f"  nothing known: no device read from {', '.join(silent)}")
        return
    compute, parameters, reason = _devices.default_cluster_devices(cluster, cluster_devices)
    policy = placement.as_policy(parameters[0] if len(parameters) == 1 else parameters)
    _say_devices(say, compute, policy, parameters[0], reason)
    given = [n for n in ("compute_devices", "parameter_device") if settings.received(n)]
    if given:
        say(f"  unless replaced by: {', '.join(settings.received(n) for n in given)}")


def _span_line(tensorflow_version, keras_version):
    """Whether this TensorFlow and Keras pair is in dpkeras's supported span, in one line."""
    from dpkeras import _version

    reason = _version.unsupported(tensorflow_version, keras_version)
    if reason is not None:
        return f"NOT supported: {reason}"
    return (
        f"Supported: TensorFlow {_version.span(_version.TENSORFLOW)} with Keras "
        f"{_version.span(_version.KERAS)} (this pair is in the span)"
    )


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
        help="also show this cluster's tasks (a JSON object or file, as for "
        "dpkeras serve; default: $TF_CONFIG's, if any): whether each answers, its devices, "
        "the client training on it, and where variables would go; read without connecting "
        "as a client, so a running training is not disturbed",
    )
    _cli.add_verbose_argument(parser)
    args = parser.parse_args(argv)

    import dpkeras
    from dpkeras import _config as config
    from dpkeras import _device_names as device_names
    from dpkeras._cli.serve import load_cluster
    from dpkeras._extended import devices
    from dpkeras.cluster import _spec

    try:
        settings = config.config_in_force()
        spec = _spec.cluster_spec_of(None if args.cluster is None else load_cluster(args.cluster))
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
    say(_span_line(tf.__version__, keras.__version__))
    say(f"Platform {platform.platform()}, {os.cpu_count()} CPU cores")
    say()
    say("Physical devices:")
    for d in tf.config.list_physical_devices():
        say(f"  {d.name} ({d.device_type})")
    cluster_devices = None
    if spec is not None:
        say(
            "Cluster (no authentication or encryption: private networks only; each task read "
            "without connecting to it as a client, so a client training there is undisturbed):"
        )
        cluster = _spec.Cluster(spec)
        cluster_devices = {}
        for task, address in cluster.tasks.items():
            state, names = _task_state(cluster, task, address)
            say(f"  {task} at {address}: {state}")
            if task in cluster.training:
                cluster_devices[task] = names
        say()
    say("Logical devices:")
    for d in tf.config.list_logical_devices():
        say(f"  {device_names.short_device(d.name)}  ({d.name})")
    say()
    say("dpkeras.scope() with no arguments would use:")
    if cluster_devices is not None:
        _say_cluster_defaults(say, cluster, cluster_devices, settings)
    else:
        try:
            resolved = devices.strategy_devices(settings, spec)
        except ValueError as e:
            say(f"  nothing: {e}")
        else:
            _say_devices(say, *resolved)
    say()
    say("Settings (the argument, else the environment variable, else the default):")
    for line in _setting_lines(settings, config.VARIABLES):
        say(f"  {line}")
    others = config.other_variables()
    if others:
        say("Other DPKERAS_* variables (no dpkeras setting: a typo?):")
        for name, value in others.items():
            say(f"  {name}={value}")
    # As the user gave them: dpkeras's own quiet level (`_quiet.quiet_level`) is not theirs.
    related = {k: _quiet.as_given(k) for k in _RELATED_ENV if _quiet.as_given(k) is not None}
    if related:
        say("Related environment:")
        for name, value in related.items():
            say(f"  {name}={value}")
    return 0
