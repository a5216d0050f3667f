"""Input for the replicas: one pipeline per input host, feeding that host's replicas.

A global batch of 256 over 2 replicas gives each 128 examples, prefetched to the replica's
device; 101 over 2 gives 51 and 50. On a cluster each worker task runs its own pipeline on its
host CPU, so batches do not flow through the client (`dpkeras.cluster._input`).
"""

import tensorflow as tf

from dpkeras import _device_names as device_names
from dpkeras import _tf_internals
from dpkeras.cluster import _input


class InputPlan:
    """Which host device feeds which compute devices.

    Args:
        workers: list of `(host device, compute devices)` pairs, canonical names; the
            compute devices of all pairs, in order, are the replicas.
    """

    def __init__(self, workers):
        self.workers = [(host, tuple(devices)) for host, devices in workers]
        self.compute_devices = tuple(d for _, devices in self.workers for d in devices)

    @classmethod
    def by_task(cls, compute_devices, local_host):
        """One input host per task: this process's `local_host` for its own devices, each other
        task's host CPU for that task's devices. Replicas keep their order within a task;
        tasks are in the order they first appear."""
        workers = {}
        for device in compute_devices:
            host = local_host if device_names.is_local(device) else device_names.host_of(device)
            workers.setdefault(host, []).append(device)
        return cls(list(workers.items()))

    @property
    def num_replicas(self):
        return len(self.compute_devices)

    def input_workers(self, options=None):
        """TF's `InputWorkers`: where each pipeline runs and which devices it feeds."""
        fetch = options is None or options.experimental_fetch_to_device
        return _tf_internals.InputWorkers(
            [(host, devices if fetch else (host,) * len(devices)) for host, devices in self.workers]
        )

    @staticmethod
    def check_options(options, api):
        """Raises NotImplementedError for per-replica input pipelines."""
        if options is not None and (
            options.experimental_replication_mode == _tf_internals.InputReplicationMode.PER_REPLICA
        ):
            raise NotImplementedError(
                f"{api} under dpkeras supports InputReplicationMode.PER_WORKER (the default): "
                f"one input pipeline rebatched over the replicas. Received: "
                f"experimental_replication_mode=PER_REPLICA."
            )

    @staticmethod
    def check_not_empty(dataset):
        """A dataset known to be empty fails here, not with a bare StopIteration in Keras."""
        if tf.get_static_value(dataset.cardinality()) == 0:
            raise ValueError(
                f"Cannot distribute an empty dataset: it yields no batch (cardinality 0), so "
                f"Keras's fit, evaluate and predict would stop with a bare StopIteration. "
                f"Received: {dataset!r}. Give it at least one batch (check for empty arrays, a "
                f"filter or take that removes everything, or batch(..., drop_remainder=True) "
                f"on fewer examples than one batch)."
            )

    def distribute_dataset(self, dataset, strategy, options):
        """`strategy.experimental_distribute_dataset`.

        On one host, TensorFlow rebatches the global batch over the replicas. On several
        (a cluster), each worker's host runs a pipeline that feeds its own replicas their
        contiguous slices of each global batch: by default each worker maps only the elements
        of its slices (see `dpkeras.cluster._input` for the policies). TensorFlow's own
        multi-worker rebatching interleaves the workers' slices (rows 0-1 and 4-5 to worker 0,
        2-3 and 6-7 to worker 1), so `predict` would return rows out of order.
        """
        self.check_options(options, "experimental_distribute_dataset")
        self.check_not_empty(dataset)
        if len(self.workers) == 1:
            return _tf_internals.get_distributed_dataset(
                dataset,
                self.input_workers(options),
                strategy,
                num_replicas_in_sync=self.num_replicas,
                options=options,
            )
        hosts = [host for host, _ in self.workers]
        firsts = [0]
        for _, devices in self.workers:
            firsts.append(firsts[-1] + len(devices))
        ranges = list(zip(firsts, firsts[1:]))
        pipelines = _input.worker_pipelines(dataset, ranges, self.num_replicas)
        if pipelines is None:  # each worker runs the whole pipeline, keeps its slices
            copies = _tf_internals.replicate(dataset, hosts)

        def dataset_fn(context):  # runs under the worker's host device
            i = context.input_pipeline_id
            if pipelines is None:
                return _worker_slices(copies[hosts[i]], *ranges[i], self.num_replicas)
            return _tf_internals.replicate(pipelines[i], [hosts[i]])[hosts[i]]

        return self.distribute_datasets_from_function(dataset_fn, strategy, options)

    def distribute_datasets_from_function(self, dataset_fn, strategy, options):
        """`strategy.distribute_datasets_from_function`: one pipeline per input host, each
        called with its `InputContext`."""
        self.check_options(options, "distribute_datasets_from_function")
        contexts = [
            _tf_internals.InputContext(
                num_input_pipelines=len(self.workers),
                input_pipeline_id=i,
                num_replicas_in_sync=self.num_replicas,
            )
            for i in range(len(self.workers))
        ]
        return _tf_internals.get_distributed_datasets_from_function(
            dataset_fn, self.input_workers(options), contexts, strategy, options=options
        )

    def distribute_values_from_function(self, value_fn):
        """`strategy.experimental_distribute_values_from_function`."""
        values = []
        for replica_id, device in enumerate(self.compute_devices):
            with tf.device(device):
                values.append(value_fn(_tf_internals.ValueContext(replica_id, self.num_replicas)))
        return _tf_internals.regroup(values, always_wrap=True)


def _worker_slices(dataset, first, end, num_replicas):
    """Per-replica batches of replicas `first`..`end - 1` from a dataset of global batches.

    A global batch of b rows is split into `num_replicas` contiguous slices as TensorFlow's
    rebatching splits it (sizes differ by at most one, larger first: 10 over 4 is 3, 3, 2, 2);
    this yields, for each global batch, the slices of the given replicas, in order.
    """

    def slices(*element):
        batch = element if len(element) > 1 else element[0]
        rows = tf.shape(tf.nest.flatten(batch)[0], out_type=tf.int64)[0]
        per, extra = rows // num_replicas, rows % num_replicas

        def start(replica):
            return replica * per + tf.minimum(replica, extra)

        def cut(replica):
            lo, hi = start(replica), start(replica + 1)
            return tf.nest.map_structure(lambda t: t[lo:hi], batch)

        return tf.data.Dataset.range(first, end).map(cut)

    return dataset.flat_map(slices)
