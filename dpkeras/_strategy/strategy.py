"""`ParameterDeviceStrategy`: variables on a parameter device, Keras computation on replicas."""

import tensorflow as tf

from dpkeras import _config, placement
from dpkeras._config import Deduplicate
from dpkeras._device_names import short_device
from dpkeras._extended.extended import ParameterDeviceExtended
from dpkeras._patches import table as keras_patches
from dpkeras._variables.partitioning import as_partitioner
from dpkeras.cluster._task import client_of


class ParameterDeviceStrategy(tf.distribute.Strategy):
    """Keeps variables on parameter devices (by default every variable, once); runs each step
    on several replicas.

    Each step runs the same Keras computation on every compute device (a replica) on its share
    of the global batch. By default every variable (layer weights, optimizer slots, metric
    state, RNG seeds, loss-scale state) lives once on the parameter device, and each replica
    reads each variable once per step. Gradients are summed on the parameter device and the
    optimizer updates there, once. This is TF1's "variables on the CPU, towers on the GPUs"
    recipe, as a `tf.distribute.Strategy` that Keras 3 trains under unchanged. A placement
    policy may instead cut a table into shards over several parameter devices, or replicate a
    variable on every compute device (`placement.hybrid()` replicates everything but tables and
    metric state): its copies' gradients are then all-reduced among the compute devices and
    every copy is updated alike (`dpkeras.ReplicatedVariable`).

    ```python
    import dpkeras, keras
    strategy = dpkeras.ParameterDeviceStrategy()          # all GPUs; variables on /cpu:0
    with strategy.scope():
        model = keras.Sequential([keras.layers.Dense(10)])
        model.compile(optimizer="adam", loss="mse")
    model.fit(x, y, batch_size=256)
    ```

    Semantics, with 2 replicas: a global batch of 256 gives each replica 128 examples; Keras
    scales each replica's loss by 1/2, the two gradients are summed on the parameter device, so
    the update equals one device's on all 256. An uneven split (a global batch of 101, split
    51/50, or a short last batch) is weighted by each replica's share in `fit`, so it too
    equals one device.

    Args:
        compute_devices: list of str, the devices that run replicas, such as
            `["/gpu:0", "/gpu:1"]`. Defaults to `$DPKERAS_COMPUTE_DEVICES` (comma-separated),
            else every GPU, else every logical CPU but the parameter device, else the one CPU.
        parameter_device: where variables live: a device string (it may also be a compute
            device), a list of devices (spread by `placement.greedy_by_size`), or a placement
            policy (see `dpkeras.placement`: any callable taking a `VariableSpec` and returning
            a device); `"hybrid"` (and `placement.hybrid` not called) is
            `placement.hybrid()`. A task named alone (`"/job:ps/task:0"`) is its CPU:0.
            Defaults to `$DPKERAS_PARAMETER_DEVICE` (one device, comma-separated devices, or
            `hybrid`), else `"/cpu:0"`.
        cluster: train on a TensorFlow cluster of `ps` and `worker` tasks (each a
            `dpkeras serve`): a dict such as `{"ps": ["10.0.0.1:2222"], "worker":
            ["10.0.0.2:2222", "10.0.0.3:2222"]}`, a `tf.train.ClusterSpec` or a
            `tf.distribute.cluster_resolver.ClusterResolver`. This process is the client: it
            connects to every task (once, see `dpkeras.cluster.join`) and drives the steps.
            Devices then default to the workers' GPUs (else their CPUs) for compute and the
            ps tasks' CPUs for variables, and `/job:...` devices may be named. Defaults to
            `$TF_CONFIG` if it names a `ps` or `worker` job, else no cluster. The constructor
            never serves: under `TF_CONFIG`, a `ps` or `worker` task that is not the client
            is refused with a ValueError naming `dpkeras.cluster.join()`, where it serves.
            Until the scope of a cluster strategy is first entered, `fit` refuses a model
            built without any strategy (it would train on the client alone). See
            docs/cluster.md.
        partitioner: cut large layer weights into shards spread over the parameter devices:
            one of TensorFlow's `tf.distribute.experimental.partitioners` (such as
            `MinSizePartitioner(min_shard_bytes=1 << 20, max_shards=2)`) or any callable with
            their signature. Keras still sees one variable of the full shape; optimizer slots
            are sharded like their variable. See docs/sharding.md. Default: no sharding.
        deduplicate: how an embedding lookup's repeated ids cross between a replica and the
            parameter device, a `dpkeras.Deduplicate` or True (`ON`), False (`OFF`) or "sum"
            (`SUM`). `ON`: each distinct id and its row cross once per replica and step;
            gradient rows of repeats are summed before they cross where that keeps Keras's
            numbers (SGD without clipping), and sent as they are otherwise. `SUM`: gradient
            rows are always summed per distinct id before the optimizer, tf.keras's and TF1's
            semantics (Adam and Adagrad then square the sum, not each repeat). `OFF`: every
            repeat crosses, both ways. Defaults to `$DPKERAS_DEDUPLICATE` (1, 0 or sum), else
            `ON`. See docs/sharding.md.

    Each setting not passed is taken from its `DPKERAS_*` environment variable, else its
    default (`dpkeras env` prints them and where each came from).

    Raises:
        TimeoutError: when a task of the cluster does not answer (it names the task).
        ValueError: for an invalid cluster, an unparseable, absent or duplicated device, an
            empty list, a parameter_device of another type, a partitioner that is not
            callable, a deduplicate other than a `dpkeras.Deduplicate`, True, False or "sum",
            or a bad `DPKERAS_*` environment value (naming it), before anything is created. A
            partitioner's invalid answer raises ValueError naming the variable, before any of
            its shards is created. A policy that fails or returns a bad device raises
            ValueError when the variable is created, naming it.
    """

    def __init__(
        self,
        compute_devices=None,
        parameter_device=None,
        cluster=None,
        partitioner=None,
        deduplicate=None,
    ):
        partitioner = as_partitioner(partitioner)
        config = _config.config_in_force(
            compute_devices=compute_devices,
            parameter_device=parameter_device,
            deduplicate=deduplicate,
        )
        spec = client_of(cluster)
        super().__init__(ParameterDeviceExtended(self, config, spec, partitioner))
        if spec is not None:
            keras_patches.hold_until_entered(self)

    @classmethod
    def of_resolved(cls, config, cluster, partitioner):
        """The strategy for settings already resolved (`dpkeras._config.config_in_force`), on
        a cluster this process already joined as its client (`dpkeras.cluster.join`), or None:
        what `dpkeras.get_strategy` builds, without resolving anything a second time."""
        strategy = cls.__new__(cls)
        tf.distribute.Strategy.__init__(
            strategy, ParameterDeviceExtended(strategy, config, cluster, partitioner)
        )
        if cluster is not None:
            keras_patches.hold_until_entered(strategy)
        return strategy

    @property
    def compute_devices(self):
        """Tuple of the canonical names of the devices that run replicas."""
        return self.extended.worker_devices

    @property
    def parameter_device(self):
        """Canonical name of the (first) device that holds variables."""
        return self.extended.parameter_devices[0]

    @property
    def partitioner(self):
        """The partitioner of layer weights, or None (no sharding)."""
        return self.extended.partitioner

    @property
    def deduplicate(self):
        """A `dpkeras.Deduplicate`: how an embedding lookup's repeated ids cross (see the
        class)."""
        return self.extended.deduplicate

    def scope(self):
        """`tf.distribute.Strategy.scope`, with dpkeras's patches (dpkeras._patches)."""
        return keras_patches.installed_during(super().scope(), self.extended.variables, self)

    def __repr__(self):
        compute = ", ".join(short_device(d) for d in self.compute_devices)
        partitioner = "" if self.partitioner is None else f", partitioner={self.partitioner!r}"
        dedup_mode = (
            "" if self.deduplicate is Deduplicate.ON else f", deduplicate={self.deduplicate!r}"
        )
        policy = self.extended.placement_policy
        parameter = (
            repr(policy)
            if placement.is_hybrid(policy)
            else repr(short_device(self.parameter_device))
        )
        return (
            f"ParameterDeviceStrategy(compute_devices=[{compute}], "
            f"parameter_device={parameter}{partitioner}{dedup_mode})"
        )
