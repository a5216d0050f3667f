"""TensorFlow's distributed datasets, whose epoch iterators make the hosts' iterators when read.

Keras makes an epoch's iterator at each epoch's start and another at its end, which the next
epoch throws away (`EpochIterator._enumerate_iterator` with `steps_per_epoch=None`), and the
same for validation. TensorFlow's distributed datasets make every input host's iterator in
`__iter__`: on a cluster two ops on each worker per iterator, the largest part of the client's
per-epoch cost that grows with the workers (issue 31). An iterator that makes them when first
read makes none for the iterator Keras throws away. This is exact only where making an iterator
changes nothing a later one reads: tf.data makes no element before the first `get_next` (maps,
prefetch and interleave start at the first read), but a `shuffle` that reshuffles each
iteration, and `Dataset.random` that rerandomizes, draw their seeds from a generator shared by
the dataset's iterators when an iterator is made (`_tf_internals.state_shared_by_iterators`).

The classes derive from TensorFlow's own distributed dataset and iterator classes (private,
exported by `dpkeras._tf_internals` with the reason), so `tf.function` and Keras take them as
TensorFlow's. The TensorFlow members they override, among them the instance attribute
`_iterators` that `_IteratorAtFirstUse` shadows with a property, and those they read, are
listed with their reasons in tests/test_architecture.py, which fails if TensorFlow no longer
has one; tests/test_iterators_at_first_use.py fails if TensorFlow's distributed datasets change
in a way this relies on. Their own attributes are named `_dpkeras_*`, apart from TensorFlow's.
"""

import collections

import tensorflow as tf

from dpkeras import _tf_internals

_NOT_YET = object()
_made = collections.Counter()  # "hosts": input hosts' iterators made at first use


class _IteratorAtFirstUse(_tf_internals.DistributedIterator):
    """TensorFlow's `DistributedIterator`, whose input hosts' iterators (`_iterators`, read by
    `get_next` and by `tf.function` through its type spec's components) are made when first
    read."""

    def __init__(self, make, element_spec, alike=False, **kwargs):
        self._dpkeras_make = make
        self._dpkeras_made = None
        self._dpkeras_alike = alike
        super().__init__(iterators=_NOT_YET, **kwargs)
        self._element_spec = element_spec

    @property
    def _iterators(self):
        if self._dpkeras_made is None:
            # `async_scope`: each host's two ops (make an iterator, initialise it) are sent
            # without waiting for the host to run them, and the scope waits once for all, as
            # TensorFlow's `__iter__` waits before a multi-device function reads them (on a
            # cluster a third less client CPU per iterator and half the time, measured at 4
            # workers).
            with tf.init_scope(), tf.experimental.async_scope():
                self._dpkeras_made = self._dpkeras_make()
            self._dpkeras_make = None
            _made.update(hosts=len(self._dpkeras_made))
        return self._dpkeras_made

    @_iterators.setter
    def _iterators(self, value):
        if value is not _NOT_YET:
            self._dpkeras_made = value

    @property
    def hosts_alike(self):
        """Whether its input hosts' pipelines yield as many elements as each other."""
        return self._dpkeras_alike

    @property
    def hosts_made(self):
        """Whether the input hosts' iterators exist yet."""
        return self._dpkeras_made is not None


class _AtFirstUse:
    """`__iter__` of TensorFlow's distributed datasets (`input_lib`, as
    `DistributedDataset.__iter__` makes an iterator) with the hosts' iterators made at first
    use, unless the hosts' pipelines share state between iterators. Mixed into each of
    TensorFlow's classes, which name their hosts' pipelines differently (`_per_host`); only
    pipelines made by a function can be made anew each epoch (`_per_host_remade`)."""

    def __init__(self, *args, source=None, remake=None, alike=False, **kwargs):
        self._dpkeras_source, self._dpkeras_shared = source, None
        self._dpkeras_remake = remake
        self._dpkeras_alike = alike
        super().__init__(*args, **kwargs)

    def __iter__(self):
        if not (tf.executing_eagerly() and self._built):
            return super().__iter__()  # in a traced function, or not built: TensorFlow's own
        iterator = self._dpkeras_iter(self._per_host())
        return super().__iter__() if iterator is None else iterator

    def _per_host_remade(self, dataset_fn):
        raise NotImplementedError("only pipelines made by a function are made anew each epoch")

    def _dpkeras_iter(self, per_host):
        remake = self._dpkeras_remake
        if remake is not None:  # each epoch's pipelines are new: they share no state
            self._dpkeras_shared = False
        if self._dpkeras_shared is None:
            pipelines = [self._dpkeras_source] if self._dpkeras_source is not None else per_host
            self._dpkeras_shared = any(
                _tf_internals.state_shared_by_iterators(p) for p in pipelines
            )
        if self._dpkeras_shared:
            return None
        input_workers, options = self._input_workers, self._options

        def make():
            hosts = per_host
            if remake is not None:
                hosts = self._per_host_remade(remake())
            return _tf_internals.iterators_per_host(hosts, input_workers, options, self._strategy)

        return _IteratorAtFirstUse(
            make,
            self._element_spec,
            input_workers=input_workers,
            strategy=self._strategy,
            cardinality=self._cardinality,
            enable_get_next_as_optional=self._enable_get_next_as_optional,
            options=options,
            replica_order=self._replica_order,
            alike=self._dpkeras_alike,
        )


class _DatasetAtFirstUse(_AtFirstUse, _tf_internals.DistributedDataset):
    def _per_host(self):
        return self._cloned_datasets


class _DatasetsFromFunctionAtFirstUse(_AtFirstUse, _tf_internals.DistributedDatasetsFromFunction):
    def _per_host(self):
        return self._datasets

    def _per_host_remade(self, dataset_fn):
        """The hosts' pipelines made by `dataset_fn`, as TensorFlow's `__init__` makes them."""
        return _tf_internals.datasets_from_function(
            self._input_contexts, self._input_workers, dataset_fn
        )


def distributed_dataset(dataset, input_workers, strategy, num_replicas_in_sync, options):
    """TensorFlow's distributed dataset of `dataset` (`input_util.get_distributed_dataset`, as
    TF's own strategies make it), whose iterators make their input hosts' iterators at first
    use unless its pipeline's iterators share state (`state_shared_by_iterators`)."""
    return _DatasetAtFirstUse(
        input_workers,
        strategy,
        dataset,
        num_replicas_in_sync=num_replicas_in_sync,
        options=options,
        source=dataset,
    )


def distributed_datasets_from_function(
    dataset_fn,
    input_workers,
    input_contexts,
    strategy,
    options,
    source=None,
    remake=None,
    alike=False,
):
    """TensorFlow's distributed dataset of one pipeline per input host
    (`input_util.get_distributed_datasets_from_function`), whose iterators make their input
    hosts' iterators at first use unless the pipelines' iterators share state: checked on
    `source`, the dataset the hosts' pipelines copy (their copies cannot be walked), or else on
    each host's pipeline. With `remake`, each iterator made eagerly reads pipelines made anew,
    at first use, by the `dataset_fn` that `remake()` returns (TensorFlow's own iterator, in a
    traced function, reads those `dataset_fn` made). `alike`: every host's pipeline yields
    as many elements as the others (see `hosts_yield_alike`)."""
    return _DatasetsFromFunctionAtFirstUse(
        input_workers,
        strategy,
        input_contexts=input_contexts,
        dataset_fn=dataset_fn,
        options=options,
        source=source,
        remake=remake,
        alike=alike,
    )


def hosts_yield_alike(iterator):
    """Whether `iterator` is an epoch iterator of this module whose input hosts' pipelines
    yield the same number of elements, known from how dpkeras made them (each host's share
    of every global batch), and yields its hosts' replicas in order: one host's
    `has_value` then answers for all (`dpkeras._patches.step_loop`)."""
    return (
        isinstance(iterator, _IteratorAtFirstUse)
        and iterator.hosts_alike
        and _tf_internals.reads_replicas_in_order(iterator)
    )


def host_iterators_made(distributed_iterator):
    """Whether a distributed iterator's input hosts' iterators exist yet."""
    if isinstance(distributed_iterator, _IteratorAtFirstUse):
        return distributed_iterator.hosts_made
    return True


def host_iterators_made_at_first_use():
    """How many input hosts' iterators this process has made at first use (a count over every
    epoch's iterator, for tests)."""
    return _made["hosts"]
