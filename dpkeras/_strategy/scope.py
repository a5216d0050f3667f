"""`dpkeras.scope()`: the one-line way in."""

import contextlib
import dataclasses
import threading

import tensorflow as tf

from dpkeras import _config
from dpkeras._strategy.strategy import ParameterDeviceStrategy
from dpkeras._variables.partitioning import as_partitioner
from dpkeras.cluster._task import join

_lock = threading.Lock()
_strategies = {}  # (Config as given, or with devices resolved, cluster jobs, partitioner) -> it


def get_strategy(
    compute_devices=None, parameter_device=None, cluster=None, partitioner=None, deduplicate=None
):
    """Returns the `ParameterDeviceStrategy` for these settings, creating it once.

    The settings are resolved as `dpkeras._config` does (the arguments, then the `DPKERAS_*`
    environment, then the defaults), then the devices are filled in and canonicalised: equal
    resolved settings give the same strategy object, so models built in two `dpkeras.scope()`
    blocks can be trained together, and a changed environment variable gives another one. A
    placement policy object or partitioner is equal only to itself. Arguments are those of
    `ParameterDeviceStrategy`.

    On a cluster it first joins it (`dpkeras.cluster.join`, the one step): the client connects;
    under `TF_CONFIG`, a `ps` or other `worker` task serves from here and never returns (its
    process ends with the client), and an `evaluator` ends with status 0.
    """
    as_partitioner(partitioner)
    config = _config.config_in_force(
        compute_devices=compute_devices, parameter_device=parameter_device, deduplicate=deduplicate
    )
    joined = join(cluster)  # a task that is not the client serves here, and does not return
    jobs = (
        None
        if joined is None
        else tuple(sorted((job, tuple(addresses)) for job, addresses in joined.as_dict().items()))
    )
    with _lock:
        asked = (config, jobs, partitioner)  # the settings as given (after the environment)
        strategy = _strategies.get(asked)
        if strategy is None:
            # Devices are resolved once, by the constructor; two spellings of the same devices
            # (a default and its explicit list, "/gpu:0" and "/device:GPU:0") find one strategy.
            made = ParameterDeviceStrategy.of_resolved(config, joined, partitioner)
            strategy = _strategies.setdefault(_resolved_key(made, config, jobs, partitioner), made)
            _strategies[asked] = strategy
        return strategy


def _resolved_key(strategy, config, jobs, partitioner):
    extended = strategy.extended
    parameter = config.parameter_device  # a policy is equal only to itself
    if parameter is None or isinstance(parameter, (str, tuple)):
        parameter = tuple(extended.parameter_devices)
    resolved = dataclasses.replace(
        config, compute_devices=tuple(strategy.compute_devices), parameter_device=parameter
    )
    return ("resolved", resolved, jobs, partitioner)


@contextlib.contextmanager
def scope(
    compute_devices=None, parameter_device=None, cluster=None, partitioner=None, deduplicate=None
):
    """Builds and trains Keras models with variables on a parameter device.

    Enters the scope of the `ParameterDeviceStrategy` for these devices (created once per
    distinct set of devices). Create and compile the model inside; `fit`, `evaluate`,
    `predict`, `save` and callbacks then work unchanged, inside or outside the block.
    Like every `tf.distribute` scope, it is thread-local.

    On a cluster (`cluster=`, or a `TF_CONFIG` naming a `ps` or `worker` job) entering it
    first joins the cluster: it calls `dpkeras.cluster.join(cluster)`, the one step. The client
    connects and enters the scope. **A `ps` or other `worker` task under `TF_CONFIG` never
    enters it: it serves from here and never returns** (its process ends with status 0 when
    the client finishes, 75 when the client is gone), and an `evaluator` ends with status 0.
    So one program can run in every task; call `dpkeras.cluster.join()` first in it, to part
    ways before building datasets.

    ```python
    import dpkeras, keras
    with dpkeras.scope() as strategy:    # or scope(compute_devices=[...], parameter_device=...)
        model = keras.Sequential([keras.Input((784,)), keras.layers.Dense(10)])
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    model.fit(x, y, batch_size=256, epochs=3)
    ```

    Args:
        compute_devices: list of str or None; see `ParameterDeviceStrategy`.
        parameter_device: str or None; see `ParameterDeviceStrategy`.
        cluster: a dict of jobs, `tf.train.ClusterSpec`, cluster resolver or None; see
            `ParameterDeviceStrategy` (with None, `$TF_CONFIG` may name a cluster).
        partitioner: a `tf.distribute.experimental.partitioners` partitioner (or a callable
            like one) that cuts large layer weights into shards; see
            `ParameterDeviceStrategy`.
        deduplicate: a `dpkeras.Deduplicate` (or True, False or "sum"): how an embedding
            lookup's repeated ids cross; see `ParameterDeviceStrategy`.

    Yields:
        The `ParameterDeviceStrategy`.

    Raises:
        ValueError: for bad devices (see `ParameterDeviceStrategy`), or when entered inside
            the scope of a different `tf.distribute` strategy.
        TimeoutError: on a cluster, a task that does not answer (see `dpkeras.cluster.join`).
    """
    strategy = get_strategy(compute_devices, parameter_device, cluster, partitioner, deduplicate)
    if tf.distribute.has_strategy():
        current = tf.distribute.get_strategy()
        if current is not strategy:
            raise ValueError(
                f"dpkeras.scope() cannot be entered inside the scope of another strategy: "
                f"{current!r} is active and this scope would be {strategy!r}. Leave the "
                f"other scope first; a model belongs to the strategy it was built under."
            )
    with strategy.scope():
        yield strategy
