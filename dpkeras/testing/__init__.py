"""Utilities for testing programs that use dpkeras: simulated devices, a local cluster.

```python
from dpkeras import testing

with testing.LocalCluster(ps=1, workers=2, cpus=2) as cluster:  # real servers on loopback
    program = "import dpkeras\n" + f"strategy = dpkeras.get_strategy(cluster={cluster.spec!r})\n"
    testing.run_python(program + "print(strategy.num_replicas_in_sync)")  # '4\n'
```

- `_cluster`: `LocalCluster`, ps and worker tasks as real `dpkeras serve` processes on free
  127.0.0.1 ports, started and stopped by a `with` block, every wait bounded; tasks can be
  killed, frozen and restarted, as a crash, a hang and a recovery (`serve_command`,
  `server_env`, `free_port` and `free_ports` for starting tasks by hand);
- `_process`: `run_python`, a program in a fresh Python, optionally on simulated CPU devices
  (a process splits its CPU once, before TensorFlow starts); `cpu_strategy`, the dpkeras
  strategy over simulated CPU devices, cached; `assert_weights_close`, two models' weights,
  array by array, within a tolerance;
- `_gpus`: `split_gpu`, one GPU split into several logical GPUs (the GPU's
  `simulate_cpu_devices`, for `make gpu-check` on a one-GPU machine);
- `_wire`: `TrafficMeter` and `tcp_traffic`, bytes on the wire per process from the kernel's
  TCP counters.
"""

from dpkeras.cluster._local import free_port, free_ports
from dpkeras.testing._cluster import LocalCluster, serve_command, server_env
from dpkeras.testing._gpus import split_gpu
from dpkeras.testing._process import assert_weights_close, cpu_strategy, run_python
from dpkeras.testing._wire import TrafficMeter, tcp_traffic

__all__ = [
    "LocalCluster",
    "TrafficMeter",
    "assert_weights_close",
    "cpu_strategy",
    "free_port",
    "free_ports",
    "run_python",
    "serve_command",
    "server_env",
    "split_gpu",
    "tcp_traffic",
]
