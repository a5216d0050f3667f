"""The step a replica is running: which replica, its device, its gradient weight, its inputs."""

import contextlib
import dataclasses
import threading

import tensorflow as tf

from dpkeras._cache import GraphCache


@dataclasses.dataclass(frozen=True)
class StepState:
    """What one call of `strategy.run` knows about its replicas.

    Attributes:
        gradient_weights: per replica, a scalar tensor that replica's gradients are scaled by
            (uneven batches in a Keras train step), or None for no scaling.
        inputs: per replica, the tensors the traced step receives, or None (eager).
    """

    gradient_weights: list = None
    inputs: list = None
    # Replica 0's aggregation=NONE writes of replicated variables, which the other replicas
    # repeat on their copies (`dpkeras._variables.replicated`): id(variable) -> [writes], and
    # (id(variable), replica id) -> how many of them that replica has repeated.
    replicated_writes: dict = dataclasses.field(default_factory=dict)
    # The whole-variable reads replicas pulled to their task's host in this call's graph
    # (`dpkeras._extended.packing.pack_reads` sends those from one ps as one tensor).
    pulls: "Pulls" = None

    def after_inputs(self, replica_id=0):
        """Orders writes made inside it after replica `replica_id`'s step inputs arrive.

        A replica-context write of a counter or a seed (the optimizer's iteration count,
        `SeedGenerator` state) has no data dependency. When Keras calls its step once more to
        find the end of a dataset of unknown size, TensorFlow may run such a write before the
        missing batch stops the step: the count and the random stream then drift, and differ
        from run to run. Writes made inside this context cannot run without the data.
        """
        inputs = self.inputs[replica_id] if self.inputs else None
        if not inputs or tf.executing_eagerly():
            return contextlib.nullcontext()
        return tf.control_dependencies(inputs)


class Pulls:
    """The reads of whole variables that one call of `strategy.run` pulled from another task
    to a worker's host, in the graph it traces.

    Only a variable's first read in the call, made before anything in the graph wrote it and
    outside any `tf.control_dependencies`, is recorded (`add`): such a read depends on nothing
    the step computes, so it can be moved into one tensor with the others from its ps after
    the replicas are traced without making a cycle. A read after a write (which the automatic
    control dependencies order after that write), or one made to wait for values of the step
    (an assert on a layer's input, say), is left as it is.
    """

    def __init__(self, graph):
        self.graph = graph
        self.entries = []  # (variable, host, the read on its device, the pulled copy)
        self._lock = threading.Lock()

    def add(self, variable, host, read, pulled):
        """Records `pulled`, the copy on `host` of `read`, if it may be packed."""
        if (
            tf.compat.v1.get_default_graph() is not self.graph
            or not read.shape.is_fully_defined()
            or variable.written_in_graph()
            or read.op.control_inputs  # made under `tf.control_dependencies` of step values
        ):
            return
        with self._lock:
            self.entries.append((variable, host, read, pulled))


@dataclasses.dataclass(frozen=True)
class ReplicaStep:
    """One replica's view of the step it is running.

    Attributes:
        replica_id: int, the replica's index in the sync group.
        num_replicas: int, replicas in sync.
        device: str, the replica's compute device (canonical name).
        gradient_weight: scalar tensor or None; see `StepState.gradient_weights`.
        state: the `StepState` of the whole step.
    """

    replica_id: int
    num_replicas: int
    device: str
    gradient_weight: object
    state: StepState

    def after_inputs(self, replica_id=0):
        """See `StepState.after_inputs`."""
        return self.state.after_inputs(replica_id)


_EMPTY = StepState()
_steps = GraphCache()  # id(extended) -> the StepStates it runs in that graph, innermost last


@contextlib.contextmanager
def running(extended, state):
    """Declares that `extended` runs a step with `state` in the current graph."""
    graph = tf.compat.v1.get_default_graph()
    key = id(extended)
    _steps.update(key, lambda stack: (stack or ()) + (state,), graph)
    try:
        yield
    finally:
        _steps.update(key, lambda stack: stack[:-1] or None, graph)


def state_of(extended):
    """The `StepState` of the step `extended` runs around the current graph (or an empty one)."""
    graph = tf.compat.v1.get_default_graph()
    while graph is not None:
        stack = _steps.get(id(extended), graph=graph)
        if stack:
            return stack[-1]
        graph = getattr(graph, "outer_graph", None)
    return _EMPTY


def current(extended):
    """The `ReplicaStep` when called inside a replica of `extended`'s strategy, else None.

    `ParameterVariable` reads and writes, and the embedding-lookup dispatcher, behave differently
    inside a replica of a dpkeras strategy; they ask `current(extended)` what step they are in,
    and nothing else.

    Where the state lives. A step's state is set by the thread that calls `strategy.run` and read
    by TensorFlow's replica threads, so it cannot be thread-local. It is keyed by the graph being
    traced instead: a replica thread traces into the caller's graph, or into a function graph
    nested in it (when the replica function is a `tf.function`), so walking from the replica's
    graph out through `outer_graph` finds the step that started it. Two threads tracing steps
    under the same strategy at once trace two different graphs and never see each other's state.
    Eager steps all share the eager default graph; the strategy runs them one at a time.

    Args:
        extended: a `ParameterDeviceExtended`.
    """
    ctx = tf.distribute.get_replica_context()
    if ctx is None or ctx.strategy.extended is not extended:
        return None
    replica_id = int(tf.get_static_value(ctx.replica_id_in_sync_group))
    state = state_of(extended)
    weights = state.gradient_weights
    return ReplicaStep(
        replica_id=replica_id,
        num_replicas=len(extended.worker_devices),
        device=extended.worker_devices[replica_id],
        gradient_weight=None if weights is None else weights[replica_id],
        state=state,
    )
