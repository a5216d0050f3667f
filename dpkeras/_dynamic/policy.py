"""Admission and eviction: which ids get a row, and which rows are freed for new ids."""

import tensorflow as tf

EVICTIONS = (None, "lfu", "lru", "ttl")


def check(eviction, ttl_steps, min_count, capacity, output_dim):
    """Validates the layer's policy arguments; raises ValueError naming the wrong one."""
    if eviction not in EVICTIONS:
        raise ValueError(f"eviction must be one of {EVICTIONS}. Received: {eviction!r}")
    if eviction == "ttl":
        if not isinstance(ttl_steps, int) or isinstance(ttl_steps, bool) or ttl_steps < 1:
            raise ValueError(
                f"eviction='ttl' needs ttl_steps, an int >= 1. Received: ttl_steps={ttl_steps!r}"
            )
    elif ttl_steps is not None:
        raise ValueError(f"ttl_steps applies to eviction='ttl' only; eviction={eviction!r}")
    for name, value in (("min_count", min_count), ("capacity", capacity)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be an int >= 1. Received: {name}={value!r}")
    if not isinstance(output_dim, int) or isinstance(output_dim, bool) or output_dim < 1:
        raise ValueError(f"output_dim must be an int >= 1. Received: {output_dim!r}")


def victims(eviction, row_ids, counts, last_seen, eligible, k):
    """The `k` rows to evict among `eligible` ones (a bool vector over rows), in order.

    `lfu`: the least often seen first (ties: the least recently seen, then the lowest row);
    `lru` and `ttl`: the least recently seen first (ties: the lowest row). Deterministic, so
    every replica count evicts the same rows.
    """
    candidates = tf.where(eligible & (row_ids >= 0))[:, 0]
    recency = tf.gather(last_seen, candidates)
    order = tf.argsort(recency, stable=True)
    if eviction == "lfu":
        frequency = tf.gather(tf.gather(counts, candidates), order)
        order = tf.gather(order, tf.argsort(frequency, stable=True))
    return tf.gather(candidates, order[:k])


def expired(row_ids, last_seen, step, ttl_steps):
    """Rows holding an id last seen more than `ttl_steps` steps before `step`."""
    return tf.where((row_ids >= 0) & (step - last_seen > ttl_steps))[:, 0]
