"""The same seeds on every input host: a pipeline's random choices made once for all hosts.

On a cluster each input host runs its own copy of a pipeline and keeps its replicas' slices
of each global batch. A random op or dataset given no seed (seed and seed2 both 0) draws fresh
seeds when its copy is made, so each host's copy decides differently: Keras's `shuffle=True`
on NumPy arrays without `keras.utils.set_random_seed` shuffles each host's copy of the arrays
in another order, and the hosts' slices of a "global batch" come from different permutations.
Measured on 1 ps + 2 workers, 16 rows in one batch: every epoch some rows were trained twice
and others not at all, and a row that must fail the step (an id out of range) was missing
from 4 fits of 12, which then trained without an error.

`Pipeline.of` reads a pipeline's serialised graph (the one its copies on the hosts are made
from) and finds such ops (`ops`); `Pipeline.seeded` gives the graph with every one of them
seeded, for the same seeds on every host and fresh seeds each epoch (`draw`). A pipeline
whose random ops all have seeds (`keras.utils.set_random_seed` gives every op one, as does
`shuffle(seed=...)`) is copied as it is: its copies agree already.
"""

import random

import tensorflow as tf

from dpkeras import _tf_internals

_SEEDS = ("seed", "seed2")


def draw():
    """A fresh nonzero seed (an op whose seeds are both 0 would draw its own)."""
    return random.SystemRandom().randrange(1, 2**62)


def _name(reference):
    """The node a graph's or a function's input reference names (`"^x"`, `"x:0"`,
    `"x:output:0"`)."""
    return reference.lstrip("^").split(":")[0]


def unseeded(node):
    """Whether `node` is a random op whose seed attributes are both 0."""
    return all(key in node.attr for key in _SEEDS) and not any(node.attr[key].i for key in _SEEDS)


def _seed_inputs(node):
    """`{seed input name: index in node.input}` of a dataset op that takes its seeds as
    inputs (`ShuffleDatasetV3`, `RandomDatasetV2`, `AnonymousSeedGeneratorHandle`, ...)."""
    found, index = {}, 0
    for name, number_attr, type_list_attr in _tf_internals.op_inputs(node.op):
        if name in _SEEDS:
            found[name] = index
        if number_attr:
            index += node.attr[number_attr].i
        elif type_list_attr:
            index += len(node.attr[type_list_attr].list.type)
        else:
            index += 1
    return found if len(found) == len(_SEEDS) else {}


def _zero_const(node):
    return (
        node is not None
        and node.op == "Const"
        and not tf.make_ndarray(node.attr["value"].tensor).any()
    )


def _unseeded_inputs(node, consts):
    """`{seed input name: index}` of a dataset op whose seed inputs are both constant 0."""
    seeds = _seed_inputs(node)
    if seeds and all(_zero_const(consts.get(_name(node.input[i]))) for i in seeds.values()):
        return seeds
    return {}


def _scopes(graph_def):
    """`(nodes, is a function body)` of the graph and of each function of its library."""
    yield graph_def.node, False
    for function in graph_def.library.function:
        yield function.node_def, True


class Pipeline:
    """A pipeline's serialised graph, to make its copies on the input hosts from.

    Attributes:
        ops: the op types of its random ops and datasets that have no seeds, one entry per
            node; empty when every one has seeds.
    """

    def __init__(self, graph_def, element_spec, ops):
        self._graph_def = graph_def
        self._element_spec = element_spec
        self.ops = ops

    @classmethod
    def of(cls, dataset):
        """The `Pipeline` of `dataset`."""
        graph_def, element_spec = _tf_internals.pipeline_graph(dataset)
        ops = []
        for nodes, _ in _scopes(graph_def):
            consts = {n.name: n for n in nodes if n.op == "Const"}
            for node in nodes:
                if unseeded(node) or _unseeded_inputs(node, consts):
                    ops.append(node.op)
        return cls(graph_def, element_spec, ops)

    def seeded(self, seed=draw):
        """The pipeline's graph with every unseeded random op and dataset given nonzero seeds
        from `seed()` (a GraphDef; the pipeline's own is unchanged)."""
        graph_def = tf.compat.v1.GraphDef()
        graph_def.CopyFrom(self._graph_def)
        for nodes, in_function in _scopes(graph_def):
            consts = {n.name: n for n in nodes if n.op == "Const"}
            new = []
            for node in nodes:
                if unseeded(node):
                    for key in _SEEDS:
                        node.attr[key].i = seed()
                    continue
                for key, index in _unseeded_inputs(node, consts).items():
                    zero = consts[_name(node.input[index])]
                    const = type(zero)()
                    const.CopyFrom(zero)
                    const.name = f"{node.name}/dpkeras_{key}"
                    value = tf.make_ndarray(zero.attr["value"].tensor)
                    const.attr["value"].tensor.CopyFrom(
                        tf.make_tensor_proto(value + seed(), dtype=value.dtype)
                    )
                    node.input[index] = f"{const.name}:output:0" if in_function else const.name
                    new.append(const)
            nodes.extend(new)
        return graph_def

    def copy(self, device, graph_def=None):
        """The pipeline made on `device`: from `graph_def` (from `seeded`), else as it is."""
        graph_def = self._graph_def if graph_def is None else graph_def
        return _tf_internals.dataset_from_graph(graph_def, device, self._element_spec)
