"""A new row's initial vector: a function of its id and a seed, whatever the order or device."""

import keras
import numpy as np
import tensorflow as tf

_GOLDEN = 0x9E3779B97F4A7C15
_MIX_1 = 0xBF58476D1CE4E5B9
_MIX_2 = 0x94D049BB133111EB
_SUPPORTED = "RandomUniform, RandomNormal, TruncatedNormal, Zeros, Ones or Constant"


def _u64(value):
    return tf.constant(value, dtype=tf.uint64)


def _splitmix64(x):
    """SplitMix64's finaliser: a bijective mix of a uint64 (Steele, Lea and Flood, 2014)."""
    x = x + _u64(_GOLDEN)
    x = tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, _u64(30))) * _u64(_MIX_1)
    x = tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, _u64(27))) * _u64(_MIX_2)
    return tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, _u64(31)))


def uniform01(seed, ids, width):
    """`[len(ids), width]` float64 numbers in (0, 1), one hash of (seed, id, column) each.

    Counter-based: the numbers of an id depend on nothing but the seed, the id and the column,
    so every replica, shard count and order of arrival gives an id the same row.
    """
    ids = tf.bitcast(tf.cast(ids, tf.int64), tf.uint64)
    key = _splitmix64(ids ^ _splitmix64(_u64(np.uint64(seed % 2**64))))
    columns = tf.cast(tf.range(width, dtype=tf.int64), tf.uint64) * _u64(_GOLDEN)
    bits = _splitmix64(key[:, None] ^ columns[None, :])
    mantissa = tf.cast(tf.bitwise.right_shift(bits, _u64(11)), tf.float64)  # 53 bits
    return (mantissa + 0.5) * 2.0**-53


def rows_initializer(initializer):
    """Returns `f(seed, ids, width, dtype) -> rows` for a Keras initializer, or raises.

    RandomUniform draws `minval + (maxval - minval) * u`; RandomNormal `mean + stddev * z`
    and TruncatedNormal the same, cut at two standard deviations (as Keras's), by the inverse
    normal CDF; Zeros, Ones and Constant their value. Initializers whose values depend on the
    table's shape (Glorot, He, orthogonal, ...) have no per-row meaning and are refused.
    """
    init = keras.initializers.get(initializer)
    config = init.get_config()
    kind = type(init).__name__
    if kind in ("Zeros", "Ones", "Constant"):
        value = {"Zeros": 0.0, "Ones": 1.0}.get(kind, config.get("value"))
        return lambda seed, ids, width, dtype: tf.fill(
            tf.stack([tf.size(ids), width]), tf.constant(value, dtype)
        )
    if kind == "RandomUniform":
        low, high = config["minval"], config["maxval"]
        return lambda seed, ids, width, dtype: tf.cast(
            low + (high - low) * uniform01(seed, ids, width), dtype
        )
    if kind in ("RandomNormal", "TruncatedNormal"):
        mean, stddev = config["mean"], config["stddev"]
        cut = 2.0 if kind == "TruncatedNormal" else None

        def normal(seed, ids, width, dtype):
            u = uniform01(seed, ids, width)
            if cut is not None:
                low, high = _normal_cdf(-cut), _normal_cdf(cut)
                u = low + (high - low) * u
            return tf.cast(mean + stddev * tf.math.ndtri(u), dtype)

        return normal
    raise ValueError(
        f"DynamicEmbedding initialises each row from its id, so embeddings_initializer must be "
        f"{_SUPPORTED}. Received: {initializer!r} ({kind})"
    )


def _normal_cdf(x):
    return 0.5 * (1.0 + float(tf.math.erf(x / np.sqrt(2.0))))


def initializer_seed(initializer, seed):
    """The seed rows are drawn with: `seed` if given, else the initializer's integer seed."""
    if seed is not None:
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise ValueError(f"seed must be an int or None. Received: {seed!r}")
        return seed
    own = getattr(keras.initializers.get(initializer), "seed", None)
    if isinstance(own, int):
        return own
    import random

    return random.randint(1, 10**9)  # seeded by keras.utils.set_random_seed
