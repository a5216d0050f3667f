"""The ids a `DynamicEmbedding` accepts: non-negative integers, or strings hashed to int64."""

import tensorflow as tf

KEY_DTYPES = ("int64", "string")
_INTEGERS = (tf.int8, tf.int16, tf.int32, tf.int64, tf.uint8, tf.uint16, tf.uint32)


def check_key_dtype(key_dtype):
    """Returns `key_dtype` if it is one of `KEY_DTYPES`, else raises naming it."""
    if key_dtype not in KEY_DTYPES:
        raise ValueError(f"key_dtype must be one of {KEY_DTYPES}. Received: {key_dtype!r}")
    return key_dtype


def check_dtype(layer_name, key_dtype, dtype):
    """Raises a TypeError when ids of `dtype` do not match the layer's `key_dtype`."""
    dtype = tf.as_dtype(dtype)
    ok = dtype == tf.string if key_dtype == "string" else dtype in _INTEGERS
    if not ok:
        expected = "strings" if key_dtype == "string" else "integers"
        raise TypeError(
            f"DynamicEmbedding {layer_name!r} has key_dtype={key_dtype!r} and expects "
            f"{expected}. Received ids of dtype {dtype.name}."
        )


def hash_strings(strings):
    """int64 ids of strings: FarmHash64 fingerprints (`tf.fingerprint`) with the sign bit
    cleared, so every id is non-negative. Two strings collide with probability 2**-63 per pair;
    the layer counts the collisions it meets (see `DynamicEmbedding.collisions`)."""
    bits = tf.bitcast(tf.fingerprint(tf.reshape(strings, [-1])), tf.int64)
    ids = tf.bitwise.bitwise_and(bits, tf.constant(0x7FFFFFFFFFFFFFFF, tf.int64))
    return tf.reshape(ids, tf.shape(strings))


def as_int64(layer_name, key_dtype, ids):
    """The layer's int64 ids for `ids` (integers or strings), checked for negatives.

    The check is an op every later use of the ids depends on: a batch holding a negative id
    fails before anything is looked up or inserted.
    """
    check_dtype(layer_name, key_dtype, ids.dtype)
    if key_dtype == "string":
        return hash_strings(ids)
    ids = tf.cast(ids, tf.int64)
    check = tf.debugging.assert_non_negative(
        ids,
        message=f"DynamicEmbedding {layer_name!r} received a negative id; ids must be >= 0",
    )
    with tf.control_dependencies([check]):
        return tf.identity(ids)
