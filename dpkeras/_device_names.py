"""Device names: one canonical spelling, and a short one for people.

Every device string dpkeras accepts goes through `canonical_device`, so `/gpu:0`, `GPU:0` and
`/job:localhost/replica:0/task:0/device:GPU:0` are the same device everywhere (placement,
reports, error messages). This module imports nothing from dpkeras: every other module may use it.
"""

import tensorflow as tf

LOCAL_JOB = "localhost"
_NAME_ONE = (
    "A device must name a type and an index, such as '/gpu:0' or '/cpu:1', or a task, such as "
    "'/job:ps/task:0' (its CPU:0)."
)


def canonical_device(device):
    """Returns the canonical, fully specified name of a device.

    A device without a job is a device of this process (job `localhost`, task 0); a device of
    a cluster task keeps its job and task. A task named without a device (`"/job:ps/task:0"`,
    as TF1's `tf.device` and `replica_device_setter` write it) is that task's CPU:0, as
    TensorFlow takes it.

    Args:
        device: str, such as `"/gpu:1"`, `"GPU:1"`, `"/device:CPU:0"`,
            `"/job:ps/task:1/device:CPU:0"` or `"/job:ps/task:1"`.

    Returns:
        str, such as `"/job:localhost/replica:0/task:0/device:GPU:1"`.

    Raises:
        ValueError: if `device` is not a string naming one device type and index.
    """
    if not isinstance(device, str):
        raise ValueError(
            f"A device must be a string such as '/gpu:0' or '/cpu:0'. "
            f"Received: {device!r} (of type {type(device).__name__})"
        )
    text = device.strip()
    if ":" not in text:
        raise ValueError(f"{_NAME_ONE} Received: {device!r}")
    if not text.startswith("/"):
        text = "/device:" + text
    try:
        spec = tf.DeviceSpec.from_string(text)
    except (ValueError, TypeError) as e:
        raise ValueError(
            f"Cannot parse device {device!r}: {e}. Expected a device such as '/gpu:0', "
            f"'/cpu:0' or '/job:localhost/replica:0/task:0/device:GPU:0'."
        ) from None
    named_task = spec.job is not None or spec.task is not None
    if spec.device_type is None and spec.device_index is None and named_task:
        spec = spec.replace(device_type="CPU", device_index=0)  # a task: its CPU:0
    if spec.device_type is None or spec.device_index is None:
        raise ValueError(f"{_NAME_ONE} Received: {device!r}")
    job = spec.job or LOCAL_JOB
    return (
        f"/job:{job}/replica:{spec.replica or 0}/task:{spec.task or 0}"
        f"/device:{spec.device_type.upper()}:{spec.device_index}"
    )


def is_local(device):
    """Whether a canonical device name belongs to this process (job `localhost`)."""
    return tf.DeviceSpec.from_string(device).job in (None, LOCAL_JOB)


def task_of(device):
    """`'/job:ps/replica:0/task:1/device:CPU:0'` -> `'/job:ps/replica:0/task:1'`."""
    return device.rsplit("/device:", 1)[0]


def host_of(device):
    """The host CPU of a device's task: `.../task:1/device:GPU:3` -> `.../task:1/device:CPU:0`."""
    return f"{task_of(canonical_device(device))}/device:CPU:0"


def replicas_by_task(devices):
    """The replicas grouped by task: `[(replica ids, the task's host CPU)]`, one pair per run of
    consecutive `devices` (the replicas' devices, in replica order) on one task.

    `['/job:worker/task:0/device:GPU:0', '/job:worker/task:0/device:GPU:1',
    '/job:worker/task:1/device:GPU:0']` -> `[([0, 1], '/job:worker/replica:0/task:0/device:CPU:0'),
    ([2], '/job:worker/replica:0/task:1/device:CPU:0')]`. A strategy's replicas are in task
    order (`dpkeras._input.plan.InputPlan.by_task`), so each task is one pair.
    """
    runs = []
    for replica, device in enumerate(devices):
        host = host_of(device)
        if runs and runs[-1][1] == host:
            runs[-1][0].append(replica)
        else:
            runs.append(([replica], host))
    return runs


def pull_device(source, consumer):
    """Where a consumer on another task should receive a value from `source`, else None.

    A tensor crosses the network once per device that consumes it; replicas on one worker
    task share one copy on that task's host CPU instead, so each variable crosses once per
    task and step however many replicas the task runs. Within one task, None: TensorFlow
    copies between its devices directly.
    """
    if not source or not consumer:
        return None
    source, consumer = canonical_device(source), canonical_device(consumer)
    return None if task_of(source) == task_of(consumer) else host_of(consumer)


def short_device(device):
    """A device name for people: `/gpu:1` for a local device, `/job:ps/task:1/cpu:0` otherwise.

    `'/job:localhost/replica:0/task:0/device:GPU:1'` -> `'/gpu:1'`.
    """
    spec = tf.DeviceSpec.from_string(device)
    local = f"/{spec.device_type.lower()}:{spec.device_index}"
    if spec.job in (None, LOCAL_JOB):
        return local
    return f"/job:{spec.job}/task:{spec.task or 0}{local}"
