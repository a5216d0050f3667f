"""Input for the replicas: one pipeline per input host, feeding that host's replicas.

A global batch of 256 over 2 replicas gives each 128 examples, prefetched to the replica's
device; 101 over 2 gives 51 and 50. (Keras's epoch loop on one machine of CPU replicas reads
whole batches instead, and the step cuts the shares: `InputPlan.reads_whole_batches`.) An
input host is the CPU that runs a pipeline: this process's for its own replicas, and on a
cluster each worker task's host CPU for that task's replicas, so batches do not flow through
the client; a pipeline that calls Python (`py_function`, `numpy_function`, `from_generator`)
runs in this process, where its Python is, and feeds every replica.

This module is the strategy's side of input (which input host feeds which replicas, the
`tf.distribute` input methods); what each host's pipeline yields on a cluster is
`dpkeras._input.sharding`.
"""

import contextlib
import logging
import threading

import tensorflow as tf

from dpkeras import _device_names as device_names
from dpkeras import _tf_internals
from dpkeras._input import at_first_use, seeds, sharding
from dpkeras.cluster import _connect
from dpkeras.cluster._spec import task_name

_log = logging.getLogger("dpkeras")
_state = threading.local()


def endless(dataset):
    """Whether `dataset` is known to never end (`tf.data.INFINITE_CARDINALITY`)."""
    return tf.get_static_value(dataset.cardinality()) == tf.data.INFINITE_CARDINALITY


def keep_endless(host_pipeline):
    """An input host's pipeline of an endless dataset, marked endless.

    Cutting each global batch into the host's slices (`flat_map`, `filter`) hides the
    dataset's length from tf.data (`UNKNOWN_CARDINALITY`), though every host gets its slices of
    every global batch forever. TensorFlow's distributed iterator reads a dataset of unknown
    length with partial-batch handling: in every step each host sends whether it has a batch to
    the task that runs the step's loop, which sums them and sends the verdict back through a
    `tf.cond` on every task, and a worker's batch is replaced by a dummy under another
    `tf.cond` when it has none. Marked endless, the iterator reads each host's batch directly
    (`DistributedIterator.get_next_as_optional`), with none of that. A host's pipeline that
    ended all the same would fail with tf.data's message, not stop the epoch silently.
    """
    if endless(host_pipeline):
        return host_pipeline
    return host_pipeline.apply(
        tf.data.experimental.assert_cardinality(tf.data.INFINITE_CARDINALITY)
    )


class InputPlan:
    """Which input host feeds which compute devices.

    Args:
        hosts: list of `(input host, compute devices)` pairs, canonical names; the compute
            devices of all pairs, in order, are the replicas.
    """

    def __init__(self, hosts, local_host=None):
        self.hosts = [(host, tuple(devices)) for host, devices in hosts]
        self.compute_devices = tuple(d for _, devices in self.hosts for d in devices)
        self.local_host = local_host or self.hosts[0][0]

    @classmethod
    def by_task(cls, compute_devices, local_host):
        """One input host per task: this process's `local_host` for its own devices, each other
        task's host CPU for that task's devices. Replicas keep their order within a task;
        tasks are in the order they first appear."""
        hosts = {}
        for device in compute_devices:
            host = local_host if device_names.is_local(device) else device_names.host_of(device)
            hosts.setdefault(host, []).append(device)
        return cls(list(hosts.items()), local_host)

    def client_host(self):
        """This process's CPU by the name the cluster knows it (`/job:chief/...` when it is
        one of its tasks; `local_host` otherwise)."""
        cluster = _connect.connected_cluster()
        own = None if cluster is None else cluster.own
        return self.local_host if own is None else f"{task_name(*own)}/device:CPU:0"

    def reads_whole_batches(self):
        """Whether Keras's epoch loop should read whole global batches on this process's CPU
        and leave the cut to the step (`whole_batches`): on one machine whose replicas are
        all CPUs.

        TensorFlow's distributed iterator is costly to make, and Keras makes one per epoch
        for training and one per epoch for validation: it traces functions for every device
        it feeds (a `MultiDeviceIterator`), ~0.13 s on a 2-core machine with 2 replicas, most
        of what a small fit costs (BENCHMARKS.md, "Per fit"). What it buys is prefetching each
        replica's share into that device's memory, which CPU replicas do not have: they read
        the host's memory. GPUs keep it, and so do clusters, whose workers' pipelines run on
        the workers (`distribute_dataset`).
        """
        return all(  # all local: one input host, this process (`by_task`)
            device_names.is_local(d) and tf.DeviceSpec.from_string(d).device_type == "CPU"
            for d in self.compute_devices
        )

    @contextlib.contextmanager
    def whole_batches(self):
        """In the block, `distribute_dataset` on this thread checks the dataset and returns it
        as it is: its iterator yields whole global batches, and a Keras step handed one whole
        batch runs each replica on its share (`dpkeras._input.shares.cut_whole_batch`)."""
        saved = getattr(_state, "whole", False)
        _state.whole = True
        try:
            yield
        finally:
            _state.whole = saved

    @property
    def num_replicas(self):
        return len(self.compute_devices)

    def input_workers(self, options=None):
        """TensorFlow's `InputWorkers` (its name for input hosts): where each pipeline runs
        and which devices it feeds."""
        fetch = options is None or options.experimental_fetch_to_device
        return _tf_internals.InputWorkers(
            [(host, devices if fetch else (host,) * len(devices)) for host, devices in self.hosts]
        )

    def feeds_only_its_own_cpu(self):
        """Whether every input host is a task of a cluster that feeds exactly one replica, its
        own CPU (a worker of one CPU device)."""
        return all(
            not device_names.is_local(host) and devices == (host,) for host, devices in self.hosts
        )

    def iterator_options(self, options):
        """The input options TensorFlow's distributed datasets get: the user's, or, when every
        input host feeds only its own CPU, options that make each host's iterator a plain
        iterator of its pipeline instead of a `MultiDeviceIterator`.

        An epoch's iterator is one iterator per input host (Keras makes two per epoch for the
        training data, and two for the validation data). A `MultiDeviceIterator` traces and
        registers six functions per device each time, on the client: about 50 ms of client
        CPU per worker per epoch. Where a host's one device is the host itself there is
        nothing to prefetch to: a plain iterator (`_tf_internals.plain_iterator_options`) is
        two ops on the host and yields the host's replica's batches as before. Hosts that feed
        other devices (GPUs, several CPUs) keep the `MultiDeviceIterator`, which prefetches to
        each.
        """
        if not self.feeds_only_its_own_cpu():
            return options
        return _tf_internals.plain_iterator_options(options)

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

        On one input host, TensorFlow rebatches the global batch over the replicas. On several
        (a cluster), each input host runs a pipeline that feeds its own replicas their
        contiguous slices of each global batch: by default each host maps only the elements
        of its slices (see `dpkeras._input.sharding` for the policies). TensorFlow's own
        multi-worker rebatching interleaves the hosts' slices (rows 0-1 and 4-5 to worker 0,
        2-3 and 6-7 to worker 1), so `predict` would return rows out of order.
        """
        self.check_options(options, "experimental_distribute_dataset")
        _connect.refuse_datasets_made_before(dataset)
        self.check_not_empty(dataset)
        if getattr(_state, "whole", False) and options is None:
            return dataset
        hosts = self
        if len(self.hosts) > 1 and _tf_internals.runs_python(dataset):
            # Python runs only in this process: the pipeline runs here and feeds every replica.
            hosts = InputPlan([(self.client_host(), self.compute_devices)])
            _log.info(
                "dpkeras: the dataset calls Python (py_function, numpy_function or "
                "from_generator): its pipeline runs in this process and feeds all %d replicas",
                self.num_replicas,
            )
        if len(hosts.hosts) == 1:
            return at_first_use.distributed_dataset(
                dataset,
                hosts.input_workers(options),
                strategy,
                num_replicas_in_sync=self.num_replicas,
                options=hosts.iterator_options(options),
            )
        hosts = [host for host, _ in self.hosts]
        firsts = [0]
        for _, devices in self.hosts:
            firsts.append(firsts[-1] + len(devices))
        ranges = list(zip(firsts, firsts[1:]))
        pipelines = sharding.host_pipelines(dataset, ranges, self.num_replicas)
        source = graph_def = None
        if pipelines is None:  # each host runs a copy of the whole pipeline, keeps its slices
            source = seeds.Pipeline.of(dataset)
            # Random ops without seeds would decide differently on each host: the hosts'
            # copies get the same seeds, fresh ones each epoch (`remake`).
            graph_def = source.seeded() if source.ops else None

        # A plain iterator (see `iterator_options`) does not buffer as a MultiDeviceIterator
        # does: each host's pipeline prefetches one element itself.
        buffered = self.feeds_only_its_own_cpu()
        infinite = endless(dataset)
        rows = sharding.rows_of_every_batch(dataset)

        def dataset_fn(context, graph_def=graph_def):  # runs under the input host's device
            i = context.input_pipeline_id
            if pipelines is None:
                copy = source.copy(hosts[i], graph_def)
                mine = sharding.host_slices(copy, *ranges[i], self.num_replicas, rows)
            else:
                mine = _tf_internals.replicate(pipelines[i], [hosts[i]])[hosts[i]]
            if infinite:
                mine = keep_endless(mine)
            return mine.prefetch(1) if buffered else mine

        def each_epoch():  # every host's copy from one graph: the same seeds
            graph_def = source.seeded()
            return lambda context: dataset_fn(context, graph_def)

        unseeded = source is not None and source.ops
        # Every host yields its share of every global batch (an empty one when it has no
        # rows), except with FILE, where each host reads files of its own.
        alike = sharding.policy_of(dataset) != sharding.AutoShardPolicy.FILE
        return self.distribute_datasets_from_function(
            dataset_fn,
            strategy,
            options,
            dataset,
            remake=each_epoch if unseeded else None,
            alike=alike,
        )

    def distribute_datasets_from_function(
        self, dataset_fn, strategy, options, source=None, remake=None, alike=False
    ):
        """`strategy.distribute_datasets_from_function`: one pipeline per input host, each
        called with its `InputContext`.

        An epoch's iterator makes the hosts' iterators when first read (see
        `dpkeras._input.at_first_use`), so the iterator Keras makes at
        the end of each epoch and throws away costs nothing; not for a pipeline whose
        iterators share state (a `shuffle` that reshuffles each iteration), checked on
        `source` (the dataset the hosts' pipelines copy) or else on each host's pipeline.
        With `remake`, each epoch's iterator reads hosts' pipelines made anew by the function
        like `dataset_fn` that `remake()` returns (the same fresh seeds on every host).
        """
        self.check_options(options, "distribute_datasets_from_function")
        contexts = [
            _tf_internals.InputContext(
                num_input_pipelines=len(self.hosts),
                input_pipeline_id=i,
                num_replicas_in_sync=self.num_replicas,
            )
            for i in range(len(self.hosts))
        ]
        return at_first_use.distributed_datasets_from_function(
            dataset_fn,
            self.input_workers(options),
            contexts,
            strategy,
            options=self.iterator_options(options),
            source=source,
            remake=remake,
            alike=alike,
        )

    def distribute_values_from_function(self, value_fn):
        """`strategy.experimental_distribute_values_from_function`."""
        values = []
        for replica_id, device in enumerate(self.compute_devices):
            with tf.device(device):
                values.append(value_fn(_tf_internals.ValueContext(replica_id, self.num_replicas)))
        return _tf_internals.regroup(values, always_wrap=True)
