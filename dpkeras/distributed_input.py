"""Input for the replicas: one pipeline per input host, rebatched over its replicas.

A global batch of 256 over 2 replicas gives each 128 examples, prefetched to the replica's
device; 101 over 2 gives 51 and 50. TensorFlow's own distributed datasets do the work; this
module says which host feeds which devices and refuses what dpkeras does not support.
"""

import tensorflow as tf

from dpkeras import _tf_internals

__all__ = ["InputPlan"]


class InputPlan:
    """Which host device feeds which compute devices.

    Args:
        host_device: canonical name of the device the input pipeline runs on.
        compute_devices: tuple of canonical names, one per replica.
    """

    def __init__(self, host_device, compute_devices):
        self.host_device = host_device
        self.compute_devices = tuple(compute_devices)

    @property
    def num_replicas(self):
        return len(self.compute_devices)

    def input_workers(self, options=None):
        """TF's `InputWorkers`: where the pipeline runs and which devices it feeds."""
        if options is not None and not options.experimental_fetch_to_device:
            targets = (self.host_device,) * self.num_replicas
        else:
            targets = self.compute_devices
        return _tf_internals.InputWorkers([(self.host_device, targets)])

    @staticmethod
    def check_options(options, api):
        """Raises NotImplementedError for per-replica input pipelines."""
        if options is not None and (options.experimental_replication_mode ==
                                    _tf_internals.InputReplicationMode.PER_REPLICA):
            raise NotImplementedError(
                f"{api} under dpkeras supports InputReplicationMode.PER_WORKER (the default): "
                f"one input pipeline rebatched over the replicas. Received: "
                f"experimental_replication_mode=PER_REPLICA.")

    @staticmethod
    def check_not_empty(dataset):
        """A dataset known to be empty fails here, not with a bare StopIteration in Keras."""
        if tf.get_static_value(dataset.cardinality()) == 0:
            raise ValueError(
                f"Cannot distribute an empty dataset: it yields no batch (cardinality 0), so "
                f"Keras's fit, evaluate and predict would stop with a bare StopIteration. "
                f"Received: {dataset!r}. Give it at least one batch (check for empty arrays, a "
                f"filter or take that removes everything, or batch(..., drop_remainder=True) "
                f"on fewer examples than one batch).")

    def distribute_dataset(self, dataset, strategy, options):
        """`strategy.experimental_distribute_dataset`."""
        self.check_options(options, "experimental_distribute_dataset")
        self.check_not_empty(dataset)
        return _tf_internals.get_distributed_dataset(
            dataset, self.input_workers(options), strategy,
            num_replicas_in_sync=self.num_replicas, options=options)

    def distribute_datasets_from_function(self, dataset_fn, strategy, options):
        """`strategy.distribute_datasets_from_function`: one pipeline, one `InputContext`."""
        self.check_options(options, "distribute_datasets_from_function")
        context = _tf_internals.InputContext(
            num_input_pipelines=1, input_pipeline_id=0, num_replicas_in_sync=self.num_replicas)
        return _tf_internals.get_distributed_datasets_from_function(
            dataset_fn, self.input_workers(options), [context], strategy, options=options)

    def distribute_values_from_function(self, value_fn):
        """`strategy.experimental_distribute_values_from_function`."""
        values = []
        for replica_id, device in enumerate(self.compute_devices):
            with tf.device(device):
                values.append(value_fn(_tf_internals.ValueContext(replica_id,
                                                                  self.num_replicas)))
        return _tf_internals.regroup(values, always_wrap=True)
