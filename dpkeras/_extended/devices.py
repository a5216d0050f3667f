"""Which devices a strategy uses: validation, defaults, and simulated CPU devices.

Names are spelled by `dpkeras._device_names`; this module decides which devices compute and which
hold variables, from the arguments, the `DPKERAS_*` settings and what this process has.
"""

import typing

import tensorflow as tf

from dpkeras import _tf_internals, placement
from dpkeras._config import VARIABLES
from dpkeras._device_names import canonical_device, is_local, short_device, task_of
from dpkeras.cluster import _connect, _devices


def _available():
    """Canonical names of the logical devices of this process (initialises TensorFlow)."""
    return [canonical_device(d.name) for d in tf.config.list_logical_devices()]


def default_parameter_device():
    """The parameter device used when none is given: `/cpu:0`."""
    return canonical_device("/cpu:0")


def default_compute_devices(parameter_devices):
    """The compute devices used when none are given, and why.

    All GPUs; with no GPU, every logical CPU except the parameter device; with a single CPU,
    that CPU (one replica, which then also holds the variables).

    Args:
        parameter_devices: canonical names of the devices that hold variables.

    Returns:
        `(devices, reason)`: canonical device names and a sentence saying why.
    """
    available = _available()
    gpus = [d for d in available if d.rsplit("/device:", 1)[1].startswith("GPU:")]
    if gpus:
        return gpus, f"all {len(gpus)} GPU(s)"
    cpus = [d for d in available if d.rsplit("/device:", 1)[1].startswith("CPU:")]
    others = [d for d in cpus if d not in parameter_devices]
    if others:
        held = ", ".join(short_device(d) for d in parameter_devices)
        return others, (
            f"no GPU; {len(others)} logical CPU device(s) other than the parameter device(s) {held}"
        )
    return cpus[:1], "no GPU and a single CPU device: one replica on it"


def _check_exists(device, role, available, given=None):
    if device not in available and not is_local(device):
        _check_remote(device, role, available, given)
    if device not in available:
        raise ValueError(
            f"The {role} {short_device(device)} does not exist in this process. "
            f"Available devices: {', '.join(short_device(d) for d in available)}. "
            f"(On a CPU-only machine, call dpkeras.simulate_cpu_devices(n) before TensorFlow "
            f"initialises to get n CPU devices.)"
        )


def _check_remote(device, role, available, given):
    """Raises ValueError for a device of another task that this process cannot use, naming
    the task and what it has."""
    spec = _connect.connected_cluster()
    if spec is None:
        raise ValueError(
            f"dpkeras runs on the devices of this process only; {given or device!r} names "
            f"another job, replica or task, and this process is connected to no cluster that "
            f"has it. Use a local device such as '/gpu:0', or pass cluster=... to train on a "
            f"cluster."
        )
    task = task_of(device)
    devices_of_task = [d for d in available if task_of(d) == task]
    if not devices_of_task:
        raise ValueError(
            f"The {role} {given or device!r} names {task}, which is not a task of the cluster "
            f"this process is connected to (jobs: {spec.as_dict()})."
        )
    raise ValueError(
        f"The {role} {given or device!r}: task {task} "
        f"({spec.tasks.get(task, '?')}) has no device "
        f"{device.rsplit('/device:', 1)[1]}. Its devices: "
        f"{', '.join(d.rsplit('/device:', 1)[1] for d in devices_of_task)}."
    )


class StrategyDevices(typing.NamedTuple):
    """A strategy's devices, validated and filled in (`strategy_devices`).

    Attributes:
        compute: tuple of str, the canonical names of the compute devices.
        policy: the placement policy (a callable).
        home: str, the canonical name of the device that holds reductions not tied to a
            variable (the policy's first device, else `/cpu:0`).
        reason: str, a sentence saying where the compute devices came from.
    """

    compute: tuple
    policy: object
    home: str
    reason: str


def strategy_devices(config, cluster=None):
    """A strategy's `StrategyDevices`, validated and filled in; see `_checked_devices`.

    With a cluster (a `tf.train.ClusterSpec` this process joined as its client, see
    `dpkeras.cluster.join`), the defaults are the cluster's: every GPU of every
    worker, else every worker's CPUs, compute; the CPU:0 of every ps task holds variables
    (spread by `greedy_by_size`), else the first worker's. See
    `dpkeras.cluster.default_cluster_devices`.

    A bad device that came from a `DPKERAS_*` environment variable is reported with that
    variable's setting, since the program itself does not name it.

    Args:
        config: the `dpkeras._config.Config` in force: its `compute_devices` and
            `parameter_device` (argument, else environment, else None).
        cluster: the `Cluster` this process joined (`dpkeras.cluster._spec.cluster_of`), or None.
    """
    compute_devices, parameter_device = config.compute_devices, config.parameter_device
    source = "argument"
    if config.source("compute_devices") == "environment":
        source = f"${VARIABLES['compute_devices']}"
    reason, home = None, None
    if cluster is not None:
        default_compute, default_parameters, reason = _devices.default_cluster_devices(cluster)
        home = default_parameters[0]  # for a policy that names no devices (a device function)
        if parameter_device is None:
            parameter_device = (
                default_parameters[0] if len(default_parameters) == 1 else default_parameters
            )
        else:  # placement.hybrid() without devices: the cluster's parameter devices
            parameter_device = placement.bind_to(parameter_device, default_parameters)
        if compute_devices is None:
            compute_devices = default_compute
        else:
            reason = None
    try:
        resolved = _checked_devices(compute_devices, parameter_device, source, home)
        return resolved if reason is None else StrategyDevices(*resolved[:3], reason)
    except ValueError as e:
        used = [s for s in ("compute_devices", "parameter_device") if config.received(s)]
        if not used:
            raise
        settings = ", ".join(config.received(s) for s in used)
        raise ValueError(
            f"{e} (Devices not passed as arguments come from the environment: {settings}.)"
        ) from None


def _checked_devices(compute_devices=None, parameter_device=None, source="argument", home=None):
    """Validates and fills in a strategy's devices.

    Precedence for each, decided by `dpkeras._config`: the argument, then
    `DPKERAS_COMPUTE_DEVICES` / `DPKERAS_PARAMETER_DEVICE`, then the defaults of
    `default_compute_devices` and `default_parameter_device` (for None here).

    Args:
        compute_devices: list or tuple of device strings, or None.
        parameter_device: a device string, a list or tuple of them, a `dpkeras.placement`
            policy or any callable `(VariableSpec) -> device`, or None.
        source: str, where `compute_devices` came from, for the reason.
        home: the device that holds reductions when the policy names no devices (a TF1
            device function); None: `default_parameter_device()`. On a cluster, its first
            parameter device (a client that is worker 0 has no `/cpu:0`).

    Returns:
        The `StrategyDevices`: the compute devices, the placement policy, the device that
        holds reductions not tied to a variable, and where the compute devices came from.

    Raises:
        ValueError: for an unparseable, absent or duplicated device, an empty list, or a
            parameter_device of another type. Nothing has been created when it is raised.
    """
    if parameter_device is None:
        parameter_device = default_parameter_device()
    policy = placement.bind_to(placement.as_policy(parameter_device), [default_parameter_device()])
    policy_devices = tuple(getattr(policy, "devices", ()))
    home = policy_devices[0] if policy_devices else home or default_parameter_device()

    if isinstance(compute_devices, str):
        raise ValueError(
            f"compute_devices must be a list of device strings, not one string. "
            f"Received: compute_devices={compute_devices!r}; did you mean [{compute_devices!r}]?"
        )
    available = _available()
    for device in policy_devices or (home,):
        _check_exists(device, "parameter device", available)
    if compute_devices is None:
        compute, reason = default_compute_devices(policy_devices or (home,))
        return StrategyDevices(tuple(compute), policy, home, reason)

    compute_devices = list(compute_devices)
    if not compute_devices:
        raise ValueError(
            "compute_devices must name at least one device. Received: compute_devices=[]. "
            "Pass None to use every GPU (or, without GPUs, every CPU device but the parameter "
            "device)."
        )
    canonical = [canonical_device(d) for d in compute_devices]
    seen = {}
    for given, name in zip(compute_devices, canonical):
        if name in seen:
            raise ValueError(
                f"compute_devices lists {short_device(name)} twice ({seen[name]!r} and "
                f"{given!r}); each compute device runs one replica. "
                f"Received: compute_devices={compute_devices!r}"
            )
        seen[name] = given
    for given, name in zip(compute_devices, canonical):
        _check_exists(name, "compute device", available, given)
    reason = f"from the {source}"
    shared = [d for d in policy_devices if d in canonical]
    if shared:
        reason += (
            f"; parameter device(s) {', '.join(short_device(d) for d in shared)} also "
            f"compute (like tf_cnn_benchmarks' --local_parameter_device)"
        )
    return StrategyDevices(tuple(canonical), policy, home, reason)


def already_split(kind, n, call):
    """Whether TensorFlow already runs with `n` logical devices of `kind` ("CPU", "GPU"), so
    that `call` (the split asked for, as written) has nothing to do; False if TensorFlow has
    not initialised its devices yet.

    Raises:
        RuntimeError: if TensorFlow has initialised with another count of them.
    """
    if not _tf_internals.context_initialized():
        return False
    current = tf.config.list_logical_devices(kind)
    if len(current) == n:
        return True
    raise RuntimeError(
        f"{call} must be called before TensorFlow initialises its devices; this process "
        f"already runs with {len(current)} logical {kind} device(s). Call it first thing in "
        f"the program, before any TensorFlow op or model is created (in tests: one process "
        f"per device configuration)."
    )


def simulate_cpu_devices(n):
    """Splits the physical CPU into `n` logical devices, `/cpu:0` ... `/cpu:{n-1}`.

    With the default devices, dpkeras then runs `n - 1` compute replicas and keeps the
    variables on `/cpu:0`: the same program as on a machine with `n - 1` GPUs.

    Must be called before TensorFlow initialises its devices, that is before any TensorFlow op,
    `tf.config.list_logical_devices()` or model is created. Calling it again with the same `n`
    afterwards is a no-op.

    ```python
    import dpkeras
    dpkeras.simulate_cpu_devices(3)     # first thing in the program
    with dpkeras.scope() as strategy:   # 2 replicas on /cpu:1, /cpu:2; variables on /cpu:0
        ...
    ```

    Args:
        n: int, at least 1.

    Raises:
        ValueError: if `n` is not a positive integer.
        RuntimeError: if TensorFlow has already initialised with another device count.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(
            f"simulate_cpu_devices(n) needs a positive integer number of CPU devices. "
            f"Received: n={n!r}"
        )
    cpu = tf.config.list_physical_devices("CPU")[0]
    if already_split("CPU", n, f"simulate_cpu_devices({n})"):
        return
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(n)]
    )
