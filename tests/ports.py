"""Free ports for test stacks."""

import random

from infra.stack.process import port_is_free


def free_port_block(size: int, low: int = 20000, high: int = 60000) -> int:
    """The first port of ``size`` consecutive free ports on 127.0.0.1."""
    rng = random.Random()
    for _ in range(500):
        base = rng.randrange(low, high - size)
        if all(port_is_free(base + i) for i in range(size)):
            return base
    raise RuntimeError(f"no {size} consecutive free ports between {low} and {high}")
