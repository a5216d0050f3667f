"""`dpkeras._cache.GraphCache`: one lock for every access, entries dropped with their graph."""

import gc
import threading
import time
import weakref

import tensorflow as tf

from dpkeras._cache import GraphCache

THREADS = 16


def _in_threads(target, count=THREADS):
    start = threading.Barrier(count)
    errors = []

    def run(i):
        try:
            start.wait(timeout=30)
            target(i)
        except Exception as e:  # reported below, with the thread's index
            errors.append((i, e))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a thread did not finish within 60 s"
    assert errors == []


def test_a_missing_value_is_created_once_however_many_threads_ask():
    cache, graph, calls = GraphCache(), tf.Graph(), []

    def create():
        calls.append(threading.get_ident())
        time.sleep(0.01)  # a thread switch here would let a second thread create it too
        return object()

    got = []
    _in_threads(lambda i: got.append(cache.get_or_create("read", create, graph=graph)))
    assert len(calls) == 1
    assert len({id(v) for v in got}) == 1


def test_concurrent_updates_are_not_lost():
    cache, graph = GraphCache(), tf.Graph()

    def push(i):
        for k in range(50):

            def append(stack, item=(i, k)):
                current = stack or ()
                time.sleep(0)  # invite a thread switch between the read and the write
                return current + (item,)

            cache.update("stack", append, graph=graph)

    _in_threads(push)
    assert len(cache.get("stack", graph=graph)) == THREADS * 50


def test_each_graph_sees_only_its_own_entries_across_threads():
    cache = GraphCache()
    graphs = [tf.Graph() for _ in range(THREADS)]

    def use(i):
        for k in range(100):
            cache.set(k, (i, k), graph=graphs[i])
        assert [cache.get(k, graph=graphs[i]) for k in range(100)] == [(i, k) for k in range(100)]

    _in_threads(use)
    assert len(cache) == THREADS


def test_the_default_graph_is_the_one_being_built():
    cache = GraphCache()
    with tf.Graph().as_default() as g:
        cache.set("k", 1)
        assert cache.get("k") == 1
    assert cache.get("k", graph=g) == 1
    assert cache.get("k") is None


def test_entries_go_with_their_graph():
    cache = GraphCache()
    graph = tf.Graph()
    cache.set("k", "v", graph=graph)
    assert len(cache) == 1
    del graph
    gc.collect()
    assert len(cache) == 0


def test_entries_that_refer_to_their_graph_go_with_it():
    """A value is usually a tensor of its graph: it must not keep the graph alive (a
    strategy's caches live as long as the process, and kept every fit's traced steps)."""
    cache = GraphCache()
    graph = tf.Graph()
    with graph.as_default():
        cache.set("read", tf.constant(1.0))
    cache.set("reads", [cache.get("read", graph=graph)], graph=graph)
    gone = weakref.ref(graph)
    assert len(cache) == 1
    del graph
    gc.collect()
    assert gone() is None
    assert len(cache) == 0


def test_a_branch_graph_sharing_its_outer_collections_has_its_own_entries():
    cache = GraphCache()

    @tf.function
    def step(flag):
        cache.set("k", "outer")

        def branch(name):
            def run():
                cache.set("k", name)
                assert cache.get("k") == name
                return tf.constant(0)

            return run

        tf.cond(flag, branch("true"), branch("false"))
        assert cache.get("k") == "outer"
        return flag

    step(tf.constant(True))
    assert len(cache) == 3  # the step's graph and its two branches', while the step lives
    del step
    gc.collect()
    assert len(cache) == 0


def test_a_function_traced_inside_a_graph_does_not_inherit_its_entries():
    cache = GraphCache()
    with tf.Graph().as_default() as outer:
        cache.set("k", "outer")

        @tf.function
        def inner():
            assert cache.get("k") is None
            return tf.constant(0)

        inner()
    assert cache.get("k", graph=outer) == "outer"


def test_update_to_none_removes_and_clear_forgets_everything():
    cache, g1, g2 = GraphCache(), tf.Graph(), tf.Graph()
    cache.set("a", 1, graph=g1)
    cache.set("b", 2, graph=g2)
    assert cache.update("a", lambda v: None, graph=g1) is None
    assert cache.get("a", graph=g1) is None and len(cache) == 1
    cache.clear()
    assert len(cache) == 0 and cache.get("b", graph=g2) is None


def test_create_may_use_the_cache():
    cache, graph = GraphCache(), tf.Graph()
    inner = cache.get_or_create(
        "outer", lambda: cache.get_or_create("inner", lambda: 7, graph=graph) + 1, graph=graph
    )
    assert inner == 8 and cache.get("inner", graph=graph) == 7
