"""The TF1 programs of docs/from-a-tf1-program.md, ported as the page shows, give one device's
numbers: the towers recipe on 2 towers equals 1 tower on the same global batches, and the trap
the page warns about (each tower's mean loss without dividing by the towers) is real.

Each run is the page's block as written, in a fresh process, with the flags a user would pass
(`--num_gpus`, `--batch_size`); only the trap's run changes one line of it.
"""

import re
import subprocess
import sys

import pytest

from dpkeras.testing import server_env
from tests.guides import DOCS, blocks

PAGE = DOCS / "from-a-tf1-program.md"
TIMEOUT = 300
DIVIDED = "loss = tower_loss(images, labels) / strategy.num_replicas_in_sync"


def _towers_block():
    (block,) = [b for b in blocks(PAGE) if not b.tags and "def tower_loss" in b.code]
    assert DIVIDED in block.code, "the towers block no longer divides as this test expects"
    return block.code


def _losses(code, tmp_path, *flags):
    path = tmp_path / "cifar10_multi_gpu_train.py"
    path.write_text(code)
    run = subprocess.run(
        [sys.executable, str(path), *flags],
        cwd=tmp_path,
        env=server_env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    losses = [float(x) for x in re.findall(r"^step \d+: loss (\S+)$", run.stdout, re.M)]
    assert len(losses) == 8, run.stdout
    assert re.search(r"^global step 8$", run.stdout, re.M), run.stdout
    return losses


@pytest.fixture(scope="module")
def one_tower(tmp_path_factory):
    return _losses(
        _towers_block(), tmp_path_factory.mktemp("one"), "--num_gpus=1", "--batch_size=32"
    )


def test_two_towers_give_one_tower_s_losses_on_the_same_global_batches(one_tower, tmp_path):
    two = _losses(_towers_block(), tmp_path)  # the defaults: 2 towers of 16
    assert two == pytest.approx(one_tower, rel=1e-5, abs=1e-6)
    assert one_tower[0] != pytest.approx(one_tower[-1], rel=1e-3)  # it trained


def test_the_trap_each_tower_s_mean_loss_undivided_trains_with_twice_the_gradient(
    one_tower, tmp_path
):
    """Without the division (TF1's `average_gradients` dropped, each tower's mean kept), the
    replicas' summed gradients are twice one tower's: the losses part from step 1 on."""
    code = _towers_block().replace(DIVIDED, "loss = tower_loss(images, labels)")
    undivided = _losses(code, tmp_path)
    halved = [loss / 2 for loss in undivided]  # each replica reported its undivided loss
    assert halved[0] == pytest.approx(one_tower[0], rel=1e-5)  # the same start
    assert halved[1:] != pytest.approx(one_tower[1:], rel=1e-3)


_CUSTOM_LOOP = """
import tensorflow as tf
from absl import app, flags

import dpkeras

flags.DEFINE_string("job_name", None, "ps or worker")
flags.DEFINE_integer("task_index", None, "the task's index")
flags.DEFINE_string("ps_hosts", None, "ps addresses")
flags.DEFINE_string("worker_hosts", None, "worker addresses")
FLAGS = flags.FLAGS


def main(_):
    dpkeras.cluster.join(
        job_name=FLAGS.job_name,
        task_index=FLAGS.task_index,
        ps_hosts=FLAGS.ps_hosts,
        worker_hosts=FLAGS.worker_hosts,
    )
    strategy = dpkeras.get_strategy()
    with strategy.scope():
        w = dpkeras.get_variable("w", (3,), initializer="ones")

    def replica(x):
        return tf.reduce_sum(w.value * x)

    @tf.function
    def step():
        return strategy.reduce("SUM", strategy.run(replica, args=(tf.ones(3),)), axis=None)

    eager = strategy.reduce("SUM", strategy.run(replica, args=(tf.ones(3),)), axis=None)
    print("REDUCED", float(step()), float(eager), strategy.num_replicas_in_sync, flush=True)


if __name__ == "__main__":
    app.run(main)
"""


def _launched(tmp_path, program, *options):
    """`program` run under `dpkeras launch <options> --ps 1 --workers 2`; asserts status 0."""
    script = tmp_path / "program.py"
    script.write_text(program)
    launch = [sys.executable, "-m", "dpkeras", "launch", *options, "--ps", "1", "--workers", "2"]
    run = subprocess.run(
        [*launch, "--", sys.executable, str(script)],
        cwd=tmp_path,
        env=server_env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return run


def test_a_custom_loop_s_strategy_reduce_works_where_the_client_is_worker_0(tmp_path):
    """`strategy.reduce(..., axis=None)` sends the sum to TensorFlow's default destination,
    `/device:CPU:0`: on a cluster whose client is one of its tasks (worker 0, started from
    TF1's flags) that is the task's CPU, not `/job:localhost`'s, which connecting renamed (it
    failed: "/job:localhost/replica:0/task:0/device:CPU:0 unknown device"). Eager and traced."""
    run = _launched(tmp_path, _CUSTOM_LOOP, "--flags")
    (line,) = re.findall(r"REDUCED .*", run.stdout)
    assert line.split() == ["REDUCED", "6.0", "6.0", "2"], line


def test_worker_0_as_the_client_computes_on_as_many_devices_as_every_worker(tmp_path):
    """`dpkeras launch --cpus 2` splits each task's CPU in two, worker 0's too when it is the
    client (`--client worker`; TF1's flags layout): 2 workers, 4 replicas. Worker 0 splits its
    CPU before TensorFlow starts, which reserving the tasks (a graph) would do (it had 1
    device, so 3 replicas, and a global batch the user did not mean)."""
    program = (
        "import dpkeras\n"
        "dpkeras.cluster.join()\n"
        "print('REPLICAS', dpkeras.get_strategy().num_replicas_in_sync, flush=True)\n"
    )
    run = _launched(tmp_path, program, "--client", "worker", "--cpus", "2")
    assert re.findall(r"REPLICAS \d+", run.stdout) == ["REPLICAS 4"], run.stdout
