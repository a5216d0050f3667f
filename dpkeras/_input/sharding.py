"""Each input host's share of the input on a cluster: the pipeline it runs for its replicas.

A dataset given to `fit`, `evaluate` or `predict` yields global batches; on a cluster each
input host (a worker task's host CPU, or the client's for its own replicas) runs its own
pipeline and feeds only its replicas their contiguous slices of each global batch. What each
host's pipeline does depends on the dataset's
`tf.data.Options().experimental_distribute.auto_shard_policy`, as under TensorFlow's
MultiWorkerMirroredStrategy:

- `AUTO` (the default): exact, and each host does only its share of the per-element work.
  The elements are cut to hosts before the per-element maps: each host keeps the elements
  that land in its replicas' slices of each global batch, maps only those, and batches them.
  The global batches, the weights and `predict`'s row order equal one process's. It applies
  to pipelines of the form `source [shuffle, repeat, take, ...] -> map* -> batch ->
  [prefetch]` whose length is known or infinite, or that drop the remainder; for any other
  pipeline, `AUTO` is `DATA`.
- `DATA`: exact. Each host runs the whole pipeline and keeps its replicas' slices of each
  global batch (`host_slices`): every host pays for every element.
- `OFF`: as `DATA` (each host reads everything; dpkeras always gives each replica its own
  slice, so no element is used twice).
- `FILE`: each host reads its own files (TensorFlow's file sharding, as in
  MultiWorkerMirroredStrategy) and batches its share of each step from them. The hosts'
  elements are not those of one process's global batches, so training is not exact; the
  hosts' files must hold the same number of batches, or the dataset must repeat.

Which input host feeds which replicas is `dpkeras._input.plan`; the split of a global batch into
the replicas' slices, `dpkeras._input.shares`.
"""

import dataclasses
import functools

import tensorflow as tf

from dpkeras import _tf_internals
from dpkeras._input import batch_rows, seeds, shares

AutoShardPolicy = tf.data.experimental.AutoShardPolicy


def policy_of(dataset):
    """The dataset's `auto_shard_policy` (AUTO when unset)."""
    policy = dataset.options().experimental_distribute.auto_shard_policy
    return AutoShardPolicy.AUTO if policy is None else policy


@dataclasses.dataclass(frozen=True)
class _Cut:
    """A pipeline `source -> maps -> batch -> tail`, to cut between source and maps."""

    source: object  # the dataset the per-element maps read
    maps: tuple  # `_tf_internals.MapStage`s, in the order they apply
    batch_size: int
    drop_remainder: bool
    elements: int  # elements into the batch: a count, or tf.data.INFINITE_CARDINALITY


def _last_batch(dataset):
    """The `batch` transformation that makes `dataset`'s elements, behind any `options` and
    `prefetch` stages, or None when another stage comes after it (or none is there)."""
    node = dataset
    while _tf_internals.dataset_kind(node) in ("options", "prefetch"):
        node = _tf_internals.dataset_input(node)
    return node if _tf_internals.dataset_kind(node) == "batch" else None


def _surely_endless(dataset):
    """Whether `dataset` never ends: `repeat()` of a dataset of known, positive length, behind
    maps, shuffles, prefetches and options. TensorFlow says `INFINITE_CARDINALITY` for more
    than that, and for some datasets that end (`choose_from_datasets` by a finite selector,
    `stop_on_empty_dataset=True` beside a finite input, a `repeat()` of a filter that stops
    passing): their last batch can be partial."""
    node = dataset
    while _tf_internals.dataset_kind(node) in ("map", "shuffle", "prefetch", "options"):
        node = _tf_internals.dataset_input(node)
    if _tf_internals.dataset_kind(node) != "repeat" or _tf_internals.repeat_count(node) != -1:
        return False
    elements = tf.get_static_value(_tf_internals.dataset_input(node).cardinality())
    return elements is not None and elements > 0


def _plan_cut(dataset):
    """The `_Cut` of `dataset`, or None when its form does not allow an exact early cut."""
    node = _last_batch(dataset)
    if node is None:
        return None
    batch_size, drop_remainder = _tf_internals.batch_arguments(node)
    maps = []
    node = _tf_internals.dataset_input(node)
    while _tf_internals.dataset_kind(node) in ("map", "prefetch"):
        if _tf_internals.dataset_kind(node) == "map":
            maps.append(_tf_internals.MapStage(node))
        node = _tf_internals.dataset_input(node)
    elements = tf.get_static_value(node.cardinality())
    if not maps or batch_size is None or elements is None:
        return None
    if elements < 0 and (elements != tf.data.INFINITE_CARDINALITY or not _surely_endless(node)):
        return None  # unknown length: the last batch's split (or a dropped one) is unknown
    return _Cut(node, tuple(reversed(maps)), batch_size, drop_remainder, int(elements))


def _batchable(element_spec):
    """Whether elements of `element_spec` stack into a batch and unstack back unchanged: dense
    tensors of fully known shape."""
    return all(
        isinstance(s, tf.TensorSpec) and s.shape.is_fully_defined()
        for s in tf.nest.flatten(element_spec)
    )


def _empty_batch(element_spec):
    """A batch of 0 elements of `element_spec`, or None when a shape is not fully known."""
    if not _batchable(element_spec):
        return None
    return tf.nest.map_structure(lambda s: tf.zeros([0] + s.shape.as_list(), s.dtype), element_spec)


def _select(cut, full, rows, last_rows):
    """The source elements one host maps: positions `[lo, hi)` of each group of `batch_size`
    source elements (a global batch's), `[last lo, last hi)` of the last, partial, group.

    Dense elements of known shape are picked per group (`batch`, one slice, `unbatch`: one
    function call per global batch); others by a predicate per element (`filter`: a function
    call per element, which on a worker costs a hand-off to tf.data's thread pool and back,
    about 30 us, on every host for every element of the dataset, its own or not).
    """
    b = cut.batch_size
    (lo, hi), (last_lo, last_hi) = rows, last_rows
    if _batchable(cut.source.element_spec):

        def pick(index, group):
            if full is None:
                start, stop = lo, hi
            else:
                start = tf.where(index < full, tf.constant(lo, tf.int64), last_lo)
                stop = tf.where(index < full, tf.constant(hi, tf.int64), last_hi)
            return tf.nest.map_structure(lambda t: t[start:stop], group)

        groups = cut.source.batch(b, drop_remainder=cut.drop_remainder)
        return groups.enumerate().map(pick).unbatch()

    def keep(i, _):
        position, batch = i % b, i // b
        in_full = tf.constant(True) if full is None else batch < full
        mine = tf.logical_and(position >= lo, position < hi)
        mine_last = tf.logical_and(position >= last_lo, position < last_hi)
        return tf.where(in_full, mine, tf.logical_and(batch == (full or 0), mine_last))

    return cut.source.enumerate().filter(keep).map(lambda _, element: element)


def _host_pipeline(cut, first, end, num_replicas):
    """The pipeline of the host of replicas `[first, end)` from `cut`: per-replica elements,
    in replica order."""
    b = cut.batch_size
    full = (
        cut.elements // b if cut.elements >= 0 else None  # infinite: every batch is full
    )
    last = 0 if full is None or cut.drop_remainder else cut.elements % b

    def bounds(rows):
        return shares.replica_start(first, rows, num_replicas), shares.replica_start(
            end, rows, num_replicas
        )

    lo, hi = bounds(b)
    last_lo, last_hi = bounds(last)
    if hi == lo:
        return None  # more replicas than a batch has rows: no per-host batch size

    mine = _select(cut, full, (lo, hi), (last_lo, last_hi))
    for stage in cut.maps:
        mine = stage.apply(mine)
    # Every batch full (no partial last one) and every replica's share alike: the host's
    # batches have known rows (`drop_remainder` drops nothing), see `_with_even_shares`.
    even = last == 0 and b % num_replicas == 0
    batches = mine.batch(hi - lo, drop_remainder=even)
    if last and last_hi == last_lo:  # the last global batch has no row for this host
        empty = _empty_batch(mine.element_spec)
        if empty is None:
            return None
        batches = batches.concatenate(tf.data.Dataset.from_tensors(empty))
    replicas = end - first
    if replicas == 1:  # the host's batch is its one replica's slice
        return batches

    def split(index, batch):
        rows = b if full is None else tf.where(index < full, b, last)
        rows = tf.cast(rows, tf.int64)

        def start(replica):
            return shares.replica_start_in_graph(tf.cast(replica, tf.int64), rows, num_replicas)

        def piece(k):
            offset = start(first)
            a, z = start(first + k) - offset, start(first + k + 1) - offset
            return batch_rows.slice_batch(batch, a, z)

        return tf.data.Dataset.range(replicas).map(piece)

    return _with_even_shares(batches.enumerate().flat_map(split), b if even else None, num_replicas)


def host_pipelines(dataset, ranges, num_replicas):
    """Each input host's pipeline, by the dataset's `auto_shard_policy`, or None for `DATA`.

    Args:
        dataset: the dataset of global batches.
        ranges: per input host, `(first replica, end replica)`, in order.
        num_replicas: replicas in sync.

    Returns:
        A list of datasets, one per host, each yielding that host's per-replica elements in
        replica order; or None when each host must run the whole pipeline and keep its
        replicas' slices (`host_slices`: `DATA`, `OFF`, or `AUTO` on a pipeline it cannot
        cut).

    Raises:
        ValueError: for `FILE` on a dataset that reads no files, naming it.
        NotImplementedError: for `HINT`.
    """
    policy = policy_of(dataset)
    if policy == AutoShardPolicy.HINT:
        raise NotImplementedError(
            "auto_shard_policy=HINT is not supported by dpkeras on a cluster; use AUTO (exact, "
            "each worker does its share), DATA, OFF, or FILE."
        )
    if policy == AutoShardPolicy.FILE:
        return [_by_files(dataset, h, len(ranges), *r, num_replicas) for h, r in enumerate(ranges)]
    if policy != AutoShardPolicy.AUTO:
        return None
    cut = _plan_cut(dataset)
    if cut is None or seeds.Pipeline.of(cut.source).ops:
        # Which host maps an element depends on the source's order: a source whose order is
        # drawn without a seed (an unseeded `shuffle`) is read whole by every host, with the
        # same seeds (`_seeds`).
        return None
    pipelines = [_host_pipeline(cut, first, end, num_replicas) for first, end in ranges]
    if any(p is None for p in pipelines):
        return None
    options = dataset.options()
    return [p.with_options(options) for p in pipelines]


def rows_of_every_batch(dataset):
    """The rows every global batch of `dataset` has, when known before it runs: its element
    spec's, or a batch size of an endless input, `[options, prefetch ...] <- batch(n) <-
    [map, shuffle ...] <- repeat() <- a dataset of known length` (every batch is full; its
    spec says None rows unless `drop_remainder=True`). Else None."""
    rows = batch_rows.static_rows_of_spec(dataset.element_spec)
    if rows is not None:
        return rows
    node = _last_batch(dataset)
    if node is None:
        return None
    size, _ = _tf_internals.batch_arguments(node)
    endless = _surely_endless(_tf_internals.dataset_input(node))
    return size if endless else None


def host_slices(dataset, first, end, num_replicas, rows):
    """`DATA`: the per-replica batches of replicas `first`..`end - 1` (one input host's) from
    the whole pipeline's global batches, whose rows are `rows` in every batch when known
    (`rows_of_every_batch` of the dataset the user gave: `dataset` may be a copy that no
    longer shows its stages).

    A global batch of b rows is split into `num_replicas` contiguous slices as TensorFlow's
    rebatching splits it (sizes differ by at most one, larger first: 10 over 4 is 3, 3, 2, 2);
    this yields, for each global batch, the slices of the given replicas, in order. Every
    host's pipeline calls one traced function (`_slicer`), given its replicas as a tensor: the
    client traces it once, not once per host and fit.
    """
    replicas = tf.constant([first, end], tf.int64)
    slicer = _slicer(num_replicas)
    slices = dataset.flat_map(lambda *element: slicer(element, replicas))
    return _with_even_shares(slices, rows, num_replicas)


def _with_even_shares(slices, rows, num_replicas):
    """`slices` (a host's per-replica batches of global batches of `rows` rows, if known),
    known to have `rows / num_replicas` rows each when that is every replica's share: the
    step is then traced for the shapes Keras's one-device step has (a global batch of known
    rows), and a gradient computes no shapes at run time (issue 43: 73 ops a step fewer on
    each worker of the benchmark's recommender at W=2, 197 -> 124). A static shape only;
    every replica's spec is the same, as a distributed dataset's spec must be."""
    if rows is None or rows % num_replicas:
        return slices
    share = rows // num_replicas

    def known(*element):  # `map` passes a tuple's components as arguments
        if not isinstance(slices.element_spec, tuple):
            (element,) = element
        return batch_rows.with_rows(element, share)

    return slices.map(known)


@functools.cache
def _slicer(num_replicas):
    """The function that cuts one global batch (a tuple of the dataset's components) into a
    dataset of the slices of replicas `replicas[0]`..`replicas[1] - 1`."""

    @tf.function(autograph=False)
    def slices(element, replicas):
        batch = element if len(element) > 1 else element[0]
        # The rows of the first component that has them: an optional input given as None, or
        # a scalar, may come first; ragged and sparse components count their rows too.
        rows = batch_rows.rows(batch_rows.first_in_batch(batch), tf.int64)

        def start(replica):
            return shares.replica_start_in_graph(replica, rows, num_replicas)

        def cut(replica):
            lo, hi = start(replica), start(replica + 1)
            return batch_rows.slice_batch(batch, lo, hi)

        return tf.data.Dataset.range(replicas[0], replicas[1]).map(cut)

    return slices


def _shard_by_files(dataset, hosts, host):
    """TensorFlow's file sharding (the rewrite MultiWorkerMirroredStrategy applies): input host
    `host`'s share (of `hosts`) of the files `dataset` reads."""
    variant = tf.raw_ops.AutoShardDataset(
        input_dataset=tf.data.experimental.to_variant(dataset),
        num_workers=hosts,
        index=host,
        auto_shard_policy=int(AutoShardPolicy.FILE),
        output_types=[s.dtype for s in tf.nest.flatten(dataset.element_spec)],
        output_shapes=[s.shape for s in tf.nest.flatten(dataset.element_spec)],
    )
    return tf.data.experimental.from_variant(variant, dataset.element_spec)


def _by_files(dataset, host, hosts, first, end, num_replicas):
    """Input host `host`'s files of `dataset`, rebatched into its share of each step."""
    try:
        mine = _shard_by_files(dataset, hosts, host)
        next(iter(mine.take(1)))  # TensorFlow rewrites lazily: fail here, not in fit
    except (tf.errors.InvalidArgumentError, tf.errors.NotFoundError) as e:
        raise ValueError(
            f"auto_shard_policy=FILE needs a dataset that reads files (TFRecordDataset, "
            f"TextLineDataset, ... from a list of files, at least one per worker); "
            f"TensorFlow could not shard this one by files: {e.message}. Received: "
            f"{dataset!r}. Use AUTO (the default) instead."
        ) from None
    batch = None
    node = dataset
    while batch is None and node is not None:
        if _tf_internals.dataset_kind(node) == "batch":
            batch = _tf_internals.batch_arguments(node)[0]
        node = _tf_internals.dataset_input(node)
    if batch is None:
        raise ValueError(
            f"auto_shard_policy=FILE needs a batched dataset, to know the global batch size. "
            f"Received: {dataset!r}."
        )
    share = shares.replica_start(end, batch, num_replicas) - shares.replica_start(
        first, batch, num_replicas
    )
    sizes = [
        shares.replica_start(r + 1, batch, num_replicas)
        - shares.replica_start(r, batch, num_replicas)
        for r in range(first, end)
    ]
    starts = [sum(sizes[:k]) for k in range(len(sizes) + 1)]

    def split(*components):
        # tf.data passes a tuple element's components as separate arguments: `(x, y)` steps
        # are cut as one batch, as a single tensor or a dict is.
        step = components if len(components) > 1 else components[0]
        return tf.data.Dataset.range(len(sizes)).map(
            lambda k: batch_rows.slice_batch(step, tf.gather(starts, k), tf.gather(starts, k + 1))
        )

    return mine.unbatch().batch(share, drop_remainder=True).flat_map(split)
