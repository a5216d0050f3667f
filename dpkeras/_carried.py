"""What a replica thread takes from the thread that runs the step.

`strategy.run` runs each replica in a thread of its own (TensorFlow's replica threads), which
take the caller's name scope and variable creators from TensorFlow, but none of the
thread-local state of dpkeras's rooms. A room whose state a replica must see (TF1's variable
scopes: a scope entered, or the root scope told to reuse, around `strategy.run`) registers how
to capture it in the calling thread and how to restore it in a replica's; the strategy carries
it across (`into_replicas`).
"""

import contextlib
import functools

_carriers = []  # (capture, restore): capture() -> state or None; restore(state) -> a context


def register(capture, restore):
    """Registers one room's thread-local state to carry into replica threads.

    Args:
        capture: a function of no arguments, called in the thread that runs the step; returns
            the state to carry, or None when there is nothing to carry.
        restore: a function of that state returning a context manager, entered around the
            replica function in each replica thread.
    """
    _carriers.append((capture, restore))


def into_replicas(fn):
    """`fn`, run in each replica thread under the caller's captured state; `fn` itself when
    no room has state to carry (so a Keras step runs as TensorFlow gives it)."""
    captured = [(restore, state) for capture, restore in _carriers if (state := capture())]
    if not captured:
        return fn

    @functools.wraps(fn)
    def in_replica(*args, **kwargs):
        with contextlib.ExitStack() as stack:
            for restore, state in captured:
                stack.enter_context(restore(state))
            return fn(*args, **kwargs)

    return in_replica
