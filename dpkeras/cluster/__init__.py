"""Training on a TensorFlow cluster: `ps` tasks hold variables, `worker` tasks compute.

Each task is a `tf.distribute.Server` (`dpkeras serve`); the process that builds the model
under `dpkeras.scope(cluster=...)` is the client. Synchronous training is fail-stop: a task
that dies or hangs ends training with an error naming it (`TaskFailedError`), and
`keras.callbacks.BackupAndRestore` resumes after a restart. docs/cluster.md has the details.

The package, one concept a module:

- `_spec`: a cluster's tasks: validating it, reading `TF_CONFIG`, naming tasks;
- `_connect`: connecting this process to a cluster as its client (the mechanics under `join`);
- `_devices`: the tasks' devices, and which compute and hold variables by default;
- `_health`: whether tasks answer, `HealthMonitor`, and naming a failed task;
- `_client_record`: which client each task serves (the record a client leaves on its tasks), read
  without connecting;
- `_task`: joining a cluster: the one step (`join`) and the client's door (`connect`), this
  process's role under `TF_CONFIG`, and serving it;
- `_loop`: the on-cluster loop (a step function coordinated by a task);
- `_local`: a cluster's tasks as processes of this machine (free ports, children).
- `_without_keras`: a task process (`dpkeras serve`) started without importing Keras.
"""

import typing

from dpkeras._lazy import exports

# Imported when first used (`dpkeras._lazy`): `dpkeras launch` uses `_local` without TensorFlow.
__getattr__, __dir__ = exports(
    __name__,
    {
        "connect": "dpkeras.cluster._task",
        "HealthMonitor": "dpkeras.cluster._health",
        "TaskFailedError": "dpkeras.cluster._health",
        "name_failures": "dpkeras.cluster._health",
        "cluster_spec_of": "dpkeras.cluster._spec",
        "resolve_cluster": "dpkeras.cluster._spec",  # deprecated: cluster_spec_of
        "join": "dpkeras.cluster._task",
    },
)

if typing.TYPE_CHECKING:  # what the names are, for readers and tools
    from dpkeras.cluster._health import HealthMonitor, TaskFailedError, name_failures
    from dpkeras.cluster._spec import cluster_spec_of
    from dpkeras.cluster._task import connect, join

__all__ = [
    "HealthMonitor",
    "TaskFailedError",
    "cluster_spec_of",
    "connect",
    "join",
    "name_failures",
]
