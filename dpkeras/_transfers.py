"""Counting what a traced step sends between devices, from the graphs TensorFlow runs."""

import collections
import dataclasses
import re

import tensorflow as tf

from dpkeras import _sizes as sizes
from dpkeras import _tf_internals
from dpkeras._device_names import canonical_device, short_device
from dpkeras._input import shares
from dpkeras.cluster import _loop

_COLLECTIVE_OPS = (
    "CollectiveReduce",
    "CollectiveReduceV2",
    "CollectiveReduceV3",
    "CollectiveGather",
    "CollectiveGatherV2",
    "NcclAllReduce",
    "CollectiveAllToAllV2",
    "CollectiveAllToAllV3",
)


# A step's batch: the replicas' shares (`shares.BATCH_SHARE_SCOPE`, made unique by a
# suffix), or what the step's iterator yields.
_BATCH = re.compile(
    rf"(^|/)({shares.BATCH_SHARE_SCOPE}(_\d+)?/|(IteratorGetNext|OptionalGetValue)(_\d+)?$)"
)


@dataclasses.dataclass(frozen=True)
class Transfer:
    """One tensor sent from `source` to `destination` device (short names, e.g. `/cpu:0`)."""

    source: str
    destination: str
    tensor: str
    dtype: str
    shape: tuple  # None entries for unknown dimensions
    bytes: int  # 0 when the shape is not fully known

    @property
    def of_the_batch(self):
        """Whether this is the batch, read on the host inside the step, rather than a weight,
        a gradient or state: a replica's share cut from the whole batch (on one machine of
        CPU replicas, see `dpkeras._patches.whole_batches`), or one replica's whole batch."""
        return _BATCH.search(self.tensor) is not None


@dataclasses.dataclass(frozen=True)
class TransferReport:
    """The transfers of one execution of a traced function, counted from its partitioned graph.

    Counts are static: each tensor's bytes come from its shape in the graph. A tensor whose
    size is known only at run time (an embedding lookup's rows after deduplication, a sharded
    table's rows, a batch dimension that is not static) counts 0 bytes; `sized_at_run_time`
    lists them, and `dpkeras.testing.TrafficMeter` measures what really crosses between
    processes.

    Attributes:
        transfers: tuple of `Transfer`, one per tensor per destination device.
        collectives: tuple of `(device, op_type, bytes)`, one per collective op instance.
        devices: tuple of the short names of the devices the function ran on.
    """

    transfers: tuple
    collectives: tuple
    devices: tuple

    @property
    def sized_at_run_time(self):
        """The `Transfer`s whose size the graph does not fix (counted as 0 bytes)."""
        return tuple(t for t in self.transfers if t.shape is None or None in t.shape)

    @property
    def batch_shares(self):
        """The `Transfer`s of the replicas' shares of the batch (`Transfer.of_the_batch`)."""
        return tuple(t for t in self.transfers if t.of_the_batch)

    def to_device(self, device, batch=True):
        """`(tensors, bytes)` received by `device` from other devices; with `batch=False`,
        without its share of the batch (weights, gradients and state only)."""
        device = short_device(canonical_device(device))
        ts = [
            t for t in self.transfers if t.destination == device and (batch or not t.of_the_batch)
        ]
        return len(ts), sum(t.bytes for t in ts)

    def from_device(self, device):
        """`(tensors, bytes)` sent by `device` to other devices."""
        device = short_device(canonical_device(device))
        ts = [t for t in self.transfers if t.source == device]
        return len(ts), sum(t.bytes for t in ts)

    def collectives_on(self, device):
        """`(collective ops, bytes reduced)` on `device`."""
        device = short_device(canonical_device(device))
        cs = [c for c in self.collectives if c[0] == device]
        return len(cs), sum(c[2] for c in cs)

    def summary(self):
        """A dict `{"src -> dst": (tensors, bytes)}` plus collectives per device, and
        `"sized at run time (not counted)"`: how many transfers count 0 bytes for that."""
        pairs = collections.defaultdict(lambda: [0, 0])
        for t in self.transfers:
            pairs[f"{t.source} -> {t.destination}"][0] += 1
            pairs[f"{t.source} -> {t.destination}"][1] += t.bytes
        out = {k: tuple(v) for k, v in sorted(pairs.items())}
        for d in self.devices:
            n, b = self.collectives_on(d)
            if n:
                out[f"collectives on {d}"] = (n, b)
        if self.sized_at_run_time:
            out["sized at run time (not counted)"] = (len(self.sized_at_run_time), 0)
        return out


def _short(device_name):
    try:
        return short_device(device_name)
    except (ValueError, TypeError):
        return device_name


def _carries_no_data(send, nodes):
    """Whether a `_Send` stands for a control edge: it carries no data, so it is not counted.

    The partitioner turns a control edge between devices into a send of a constant that has
    only control inputs (`.../ctrl/_N`, or a `GroupCrossDeviceControlEdges` node).
    """
    if send.attr["tensor_name"].s.startswith(b"GroupCrossDeviceControlEdges"):
        return True
    source = nodes.get(send.input[0].split(":")[0].lstrip("^"))
    return (
        source is not None
        and source.op == "Const"
        and all(i.startswith("^") for i in source.input)
        and bool(source.input)
    )


def _shapes_graph(graph_def):
    """A `tf.Graph` of `graph_def`, to read static shapes from.

    A function spanning several tasks of a cluster has one post-optimisation graph per task,
    merged into one `GraphDef` whose argument and return nodes repeat names: only the first
    node of each name is kept, which leaves the shapes of the transferred tensors intact.
    """
    seen, unique = set(), type(graph_def)()
    unique.library.CopyFrom(graph_def.library)
    unique.versions.CopyFrom(graph_def.versions)
    for node in graph_def.node:
        if node.name not in seen:
            seen.add(node.name)
            unique.node.add().CopyFrom(node)
    shapes = tf.Graph()
    with shapes.as_default():
        tf.graph_util.import_graph_def(unique, name="")
    return shapes


def _report_from_function_graph(function_graph):
    shapes = _shapes_graph(function_graph.post_optimization_graph)

    def output(name):
        node, _, index = name.partition(":")
        try:
            return shapes.get_operation_by_name(node).outputs[int(index or 0)]
        except (KeyError, ValueError, IndexError):
            return None

    transfers, collectives, seen_devices = [], [], set()
    for partition in function_graph.partition_graphs:
        by_name = {node.name: node for node in partition.node}
        for node in partition.node:
            if node.device:
                seen_devices.add(_short(node.device))
            if node.op == "_Send":
                source, destination = (
                    _short(node.attr["send_device"].s.decode()),
                    _short(node.attr["recv_device"].s.decode()),
                )
                if source == destination or _carries_no_data(node, by_name):
                    continue
                dtype = tf.as_dtype(node.attr["T"].type)
                tensor = output(node.input[0])
                shape = (
                    tuple(tensor.shape.as_list())
                    if (tensor is not None and tensor.shape.rank is not None)
                    else None
                )
                size = sizes.nbytes(shape, dtype)
                transfers.append(
                    Transfer(
                        source,
                        destination,
                        re.sub(r"^edge_\d+_", "", node.attr["tensor_name"].s.decode()),
                        dtype.name,
                        shape,
                        size,
                    )
                )
            elif node.op in _COLLECTIVE_OPS:
                tensor = output(node.name + ":0")
                size = 0 if tensor is None else sizes.nbytes(tensor.shape, tensor.dtype)
                collectives.append((_short(node.device), node.op, size))
    return TransferReport(tuple(transfers), tuple(collectives), tuple(sorted(seen_devices)))


class TransferRecorder:
    """Records, as a context manager, the functions instantiated inside its block."""

    def __init__(self):
        self._metadata = None

    def __enter__(self):
        _tf_internals.enable_run_metadata()
        return self

    def __exit__(self, *exc):
        self._metadata = _tf_internals.export_and_disable_run_metadata()
        return False

    def reports(self):
        """A `TransferReport` for every multi-device function recorded, largest first."""
        if self._metadata is None:
            raise RuntimeError(
                "record_transfers() has not finished yet; call report() after the `with` block."
            )
        reports = [
            _report_from_function_graph(fg)
            for fg in self._metadata.function_graphs
            if len(fg.partition_graphs) > 1
        ]
        return sorted(
            reports,
            key=lambda r: (len(r.devices), len(r.transfers) + len(r.collectives)),
            reverse=True,
        )

    def report(self):
        """The report of the function that spans the most devices: the training step.

        Input-pipeline functions (prefetching batches to each device) span two devices; a step
        of N replicas with a parameter device spans N + 1.

        Raises:
            ValueError: if no multi-device function was instantiated while recording (for
                example, because the step had been traced before `record_transfers()`).
        """
        reports = self.reports()
        if not reports:
            raise ValueError(
                "No multi-device function was instantiated while recording. Functions traced "
                "before record_transfers() are not recorded: set model.train_function = None "
                "(or use dpkeras.train_step_transfers) so the step is traced inside."
            )
        return reports[0]


def record_transfers():
    """Records the partitioned graphs of functions instantiated inside the block.

    TensorFlow splits a multi-device function into one graph per device and connects them with
    `_Send`/`_Recv` pairs, one pair per tensor and destination device. Those partition graphs are
    what runs, so counting their `_Recv` nodes counts real transfers per execution of the function,
    independent of the machine and of timing. Collective ops (MirroredStrategy's all-reduce) are
    counted separately, with the bytes they reduce.

    ```python
    with dpkeras.record_transfers() as recorder:
        model.fit(x, y, batch_size=256, steps_per_epoch=1, epochs=1)
    report = recorder.report()              # the step function: the one spanning most devices
    report.to_device("/cpu:1")              # (tensors, bytes) received by /cpu:1 per step
    ```

    Returns:
        A `TransferRecorder` to use as a context manager; call its `report()` after the block.
    """
    return TransferRecorder()


def train_step_transfers(model, x, y=None, batch_size=None, sample_weight=None):
    """Traces and runs one real training step of `model` and reports its transfers.

    The model's weights and optimizer state advance by that one step; its compiled train
    function is reset before and after, so later `fit` calls trace afresh.

    Args:
        model: a compiled Keras model.
        x, y, sample_weight: one global batch, as for `model.fit`; or `x` a batched
            `tf.data.Dataset` (its first batch is the step's).
        batch_size: int; defaults to the length of `x` (none for a dataset).

    Returns:
        The `TransferReport` of the step: static counts, with the tensors sized only at run
        time in its `sized_at_run_time` (see `TransferReport`).
    """
    if batch_size is None and not isinstance(x, tf.data.Dataset):
        batch_size = len(tf.nest.flatten(x)[0])
    model.train_function = None
    try:
        # On a cluster the step function would otherwise run from a task (the on-cluster
        # loop), whose partitions this process does not see.
        with record_transfers() as recorder, _loop.on_the_client():
            model.fit(
                x,
                y,
                sample_weight=sample_weight,
                batch_size=batch_size,
                epochs=1,
                steps_per_epoch=1,
                shuffle=False,
                verbose=0,
            )
    finally:
        model.train_function = None
    return recorder.report()
