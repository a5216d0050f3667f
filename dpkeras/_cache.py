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
    graph is meaningless in another. Entries are held by a weak reference to their graph, so
    they go when the graph goes, and a long run keeps only its live graphs' entries.

    The locking rule: every read, write and creation happens under the cache's one lock, and a
    value missing from the cache is created under it too (`get_or_create`, `update`), so two
    threads tracing at once never both create an entry, nor lose one. The lock is re-entrant:
    a `create` or `change` function may use the cache.

    Every method takes `graph`, defaulting to the graph being built in this thread
    (`tf.compat.v1.get_default_graph()`).
    """

    def __init__(self):
        self._lock = threading.RLock()
        self._graphs = weakref.WeakKeyDictionary()  # graph -> {key: value}

    def get(self, key, default=None, graph=None):
        """The value of `key` in `graph`, or `default`."""
        with self._lock:
            return self._graphs.get(_current_graph(graph), {}).get(key, default)

    def set(self, key, value, graph=None):
        """Sets `key` to `value` in `graph`."""
        with self._lock:
            self._graphs.setdefault(_current_graph(graph), {})[key] = value

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
            entries = self._graphs.get(graph, {})
            value = change(entries.get(key))
            if value is None:
                entries.pop(key, None)
                if not entries:
                    self._graphs.pop(graph, None)
            else:
                self._graphs.setdefault(graph, entries)[key] = value
            return value

    def clear(self):
        """Forgets every entry of every graph."""
        with self._lock:
            self._graphs.clear()

    def __len__(self):
        """How many live graphs have entries (it must not grow over a long run)."""
        with self._lock:
            return len(self._graphs)
