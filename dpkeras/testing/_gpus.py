"""One GPU seen as several: `split_gpu`, so that several replicas run where there is one GPU.

The GPU's counterpart of `dpkeras.simulate_cpu_devices`: the same program that runs on a
machine with N GPUs runs on one GPU split into N logical GPUs, each with its own memory limit
(TensorFlow's logical device configuration). `make gpu-check` uses it on a one-GPU machine;
the test suite reads `DPKERAS_TEST_LOGICAL_GPUS` (tests/conftest.py) and the benchmark its
`--logical_gpus` flag.
"""

import tensorflow as tf

from dpkeras._extended.devices import already_split

DEFAULT_MEMORY_MB = 1536  # per logical GPU: the benchmark's models and the tests fit in it


def split_gpu(n, memory_mb=DEFAULT_MEMORY_MB):
    """Splits the first physical GPU into `n` logical GPUs, `/gpu:0` ... `/gpu:{n-1}`.

    Other physical GPUs are hidden, so that the process sees exactly `n` GPUs. Must be called
    before TensorFlow initialises its devices; calling it again afterwards with the same `n` is
    a no-op.

    ```python
    from dpkeras import testing
    testing.split_gpu(2)                 # first thing in the program
    with dpkeras.scope() as strategy:    # 2 replicas on /gpu:0, /gpu:1; variables on /cpu:0
        ...
    ```

    Args:
        n: int, at least 1: the logical GPUs to make.
        memory_mb: int, the memory limit of each, in MiB (their sum must fit the GPU).

    Raises:
        ValueError: if `n` or `memory_mb` is not a positive integer.
        RuntimeError: if there is no GPU, or TensorFlow has already initialised with another
            GPU count.
    """
    for name, value in (("n", n), ("memory_mb", memory_mb)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(
                f"split_gpu(n, memory_mb) needs positive integers. Received: {name}={value!r}"
            )
    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        raise RuntimeError(
            f"split_gpu({n}) needs a GPU; TensorFlow sees none on this machine "
            f"(tf.config.list_physical_devices('GPU') is empty). Without GPUs, "
            f"dpkeras.simulate_cpu_devices splits the CPU instead."
        )
    if already_split("GPU", n, f"split_gpu({n})"):
        return
    tf.config.set_visible_devices(gpus[:1], "GPU")
    tf.config.set_logical_device_configuration(
        gpus[0], [tf.config.LogicalDeviceConfiguration(memory_limit=memory_mb)] * n
    )


def logical_split(physical_gpus, split=2):
    """How many logical GPUs `make gpu-check` makes of `physical_gpus` (names): `split` when
    there is exactly one (so that several replicas run), 0 (no split) when there are none or
    several."""
    if isinstance(split, bool) or not isinstance(split, int) or split < 1:
        raise ValueError(f"The split must be a positive integer. Received: split={split!r}")
    return split if len(physical_gpus) == 1 and split > 1 else 0
