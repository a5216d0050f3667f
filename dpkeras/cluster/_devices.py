"""The devices of a cluster's tasks, and which compute and hold variables by default."""

import tensorflow as tf


def task_devices(cluster):
    """`{task name: [device names]}` of the ps and worker tasks of a resolved `Cluster`
    (`dpkeras.cluster._spec.cluster_of`), as TensorFlow lists them.

    Call after `connect`: `tf.config.list_logical_devices()` then lists every remote device
    with its full name, such as `/job:ps/replica:0/task:0/device:CPU:0`.
    """
    names = [d.name for d in tf.config.list_logical_devices()]
    return {task: [n for n in names if n.startswith(task + "/")] for task in cluster.training}


def _device_kind(name):
    return name.rsplit("/device:", 1)[1].split(":")[0]


def default_cluster_devices(cluster, devices=None):
    """The compute and parameter devices used on a cluster when none are given, and why.

    Compute: every GPU of every worker task; with no GPU on the workers, every CPU device of
    every worker (except the parameter device). Parameters: the CPU:0 of every ps task; with no
    ps job, the CPU:0 of the first worker.

    Args:
        cluster: the `Cluster` this process is connected to (`dpkeras.cluster._spec.cluster_of`).
        devices: `{task name: [device names]}` of its ps and worker tasks, or None: the ones
            this process lists (`task_devices`). `dpkeras env` reads them without connecting.

    Returns:
        `(compute_devices, parameter_devices, reason)`: lists of full device names and a
        sentence saying why.

    Raises:
        RuntimeError: if a task lists no device (this process is not connected to it).
    """
    devices = task_devices(cluster) if devices is None else devices
    empty = [task for task, names in devices.items() if not names]
    if empty:
        raise RuntimeError(
            f"No device of {', '.join(empty)} is known to this process; connect to the cluster "
            f"first (dpkeras.cluster.connect). Known devices: "
            f"{[d.name for d in tf.config.list_logical_devices()]}."
        )
    workers = [t for t in devices if t.startswith("/job:worker/")]
    ps = [t for t in devices if t.startswith("/job:ps/")]
    if ps:
        parameter = [f"{t}/device:CPU:0" for t in ps]
        where = f"the CPU:0 of each of the {len(ps)} ps task(s)"
    else:
        parameter = [f"{workers[0]}/device:CPU:0"]
        where = f"no ps job: the CPU:0 of the first worker, {workers[0]}"
    gpus = [d for t in workers for d in devices[t] if _device_kind(d) == "GPU"]
    if gpus:
        return (
            gpus,
            parameter,
            (
                f"compute on all {len(gpus)} GPU(s) of the {len(workers)} "
                f"worker(s); variables on {where}"
            ),
        )
    cpus = [
        d for t in workers for d in devices[t] if _device_kind(d) == "CPU" and d not in parameter
    ]
    if not cpus:  # a single worker with a single CPU and no ps: it does both
        cpus = list(parameter)
    return (
        cpus,
        parameter,
        (
            f"no GPU on the workers: compute on {len(cpus)} CPU device(s) of "
            f"the {len(workers)} worker(s); variables on {where}"
        ),
    )
