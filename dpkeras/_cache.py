"""`GraphCache`: values kept per traced graph, under one lock, dropped with their graph."""

import threading
import weakref

import tensorflow as tf


def _current_graph(graph):
    return tf.compat.v1.get_default_graph() if graph is None else graph


class GraphCache:
    """A mapping from (graph, key) to value, safe to share between threads.

    dpkeras remembers what it made while tracing a step (a replica's read of a variable, the
    reductions it made, the step a replica runs), and only for that graph: a tensor of one
    graph is meaningless in another. The entries go when their graph goes, so a long run (or
    a process that fits many models) keeps only its live graphs' entries.

    The graph holds its own entries, not the cache: a value is usually a tensor of its graph,
    which refers to the graph, so a cache holding entries (even under a weak reference to the
    graph) would keep every graph alive for as long as the cache lives: a strategy's ledger
    kept each fit's traced steps, ~4 MB a model. The entries are in one of the graph's
    collections (`tf.Graph.get_collection_ref`), under a key that is this cache's own object,
    not a string: TensorFlow neither exports nor copies into the functions traced inside the
    graph a collection not named by a string (`Graph.get_all_collection_keys`). A cond or
    while branch's graph shares its outer graph's collections, so that collection maps each
    graph (weakly) to its entries. The cache itself only knows which graphs have entries, by
    weak reference.

    The locking rule: every read, write and creation happens under the cache's one lock, and a
    value missing from the cache is created under it too (`get_or_create`, `update`), so two
    threads tracing at once never both create an entry, nor lose one. The lock is re-entrant:
    a `create` or `change` function may use the cache.

    Every method takes `graph`, defaulting to the graph being built in this thread
    (`tf.compat.v1.get_default_graph()`).
    """

    def __init__(self):
        self._lock = threading.RLock()
        self._key = object()  # this cache's collection in each graph (not a string: see above)
        self._graphs = weakref.WeakSet()  # the graphs this cache has entries in

    def _entries(self, graph, create=False):
        """`graph`'s entries ({key: value}); None if it has none and not `create`."""
        held = graph.get_collection(self._key)  # a copy of the list: creates no collection
        if not held:
            if not create:
                return None
            held = [weakref.WeakKeyDictionary()]  # graph -> {key: value}
            graph.add_to_collection(self._key, held[0])
        by_graph = held[0]
        entries = by_graph.get(graph)
        if entries is None and create:
            entries = by_graph[graph] = {}
            self._graphs.add(graph)
        return entries

    def _drop(self, graph):
        held = graph.get_collection(self._key)
        if held:
            held[0].pop(graph, None)
        self._graphs.discard(graph)

    def get(self, key, default=None, graph=None):
        """The value of `key` in `graph`, or `default`."""
        with self._lock:
            return (self._entries(_current_graph(graph)) or {}).get(key, default)

    def set(self, key, value, graph=None):
        """Sets `key` to `value` in `graph`."""
        with self._lock:
            self._entries(_current_graph(graph), create=True)[key] = value

    def get_or_create(self, key, create, graph=None):
        """The value of `key` in `graph`; if there is none, `create()`, stored and returned."""
        return self.update(key, lambda value: create() if value is None else value, graph)

    def update(self, key, change, graph=None):
        """Sets `key` to `change(its value, or None)`, atomically; None removes `key`.

        Returns:
            The new value (None if removed).
        """
        graph = _current_graph(graph)
        with self._lock:
            value = change((self._entries(graph) or {}).get(key))
            if value is not None:
                self._entries(graph, create=True)[key] = value
                return value
            entries = self._entries(graph)
            if entries is not None:
                entries.pop(key, None)
                if not entries:
                    self._drop(graph)
            return None

    def clear(self):
        """Forgets every entry of every graph."""
        with self._lock:
            for graph in list(self._graphs):
                self._drop(graph)

    def __len__(self):
        """How many live graphs have entries (it must not grow over a long run)."""
        with self._lock:
            return len(self._graphs)
