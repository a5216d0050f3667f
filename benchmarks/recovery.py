r"""What recovering from a lost task costs, on a loopback cluster: seconds and steps.

Starts a cluster of 2 ps and 2 workers (`dpkeras.testing.LocalCluster`, real servers on
127.0.0.1) and, for each case, a client that trains a small recommender (an `Embedding`, two
`Dense` layers, Adam) with `keras.callbacks.BackupAndRestore` and kills one task with SIGKILL
in the middle of an epoch; the benchmark starts the task again on its address once it is gone,
as a job scheduler would (`restartPolicy: OnFailure`). The cases:

- `worker-left-out`: a worker lost, `fit` goes on without it (the default), and takes it back at
  the start of the next epoch once it answers;
- `worker-waited`: the same with `$DPKERAS_ELASTIC_WORKERS=0`: `fit` waits for it;
- `ps-waited`: a ps lost: `fit` waits for it, makes its variables again, restores the backup;
- each again with `-hybrid`: the model under `placement.hybrid()` (the table on the ps tasks,
  the dense layers copied on every replica's device and all-reduced): a worker's copies are
  left out with it and made again when it is back.

For each: the median step time before the loss, the seconds from the kill to the next trained
step, the seconds the task took to start again (the scheduler's share), the steps trained again
(those since the last backup) and the bytes a restore writes (every variable once, from the
client, and under hybrid a dense variable once per copy). Each client records its own step
times; nothing here depends on this machine's speed beyond the seconds themselves.

    python -m benchmarks.recovery                      # every case, ~6 minutes
    python -m benchmarks.recovery --cases=ps-waited --steps_per_epoch=40
"""

import json
import os
import statistics
import subprocess
import sys
import textwrap
import time

from absl import app, flags

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

FLAGS = flags.FLAGS
_ALL_ON_PS = {
    "worker-left-out": ("worker", {}),
    "worker-waited": ("worker", {"DPKERAS_ELASTIC_WORKERS": "0"}),
    "ps-waited": ("ps", {}),
}
# case: (the job of the task lost, the client's environment, its placement)
CASES = {name: (job, env, "all-on-ps") for name, (job, env) in _ALL_ON_PS.items()}
CASES.update({f"{name}-hybrid": (job, env, "hybrid") for name, (job, env) in _ALL_ON_PS.items()})
flags.DEFINE_list("cases", list(CASES), f"Cases to run, of {list(CASES)}.")
flags.DEFINE_integer("steps_per_epoch", 20, "Steps per epoch (global batch 256).")
flags.DEFINE_integer("save_freq", 5, "BackupAndRestore's save_freq, in steps.")
flags.DEFINE_integer("epochs", 4, "Epochs of each fit.")
flags.DEFINE_string("out", "results/recovery.json", "Results written here (directory created).")

_CLIENT = """
import json, os, signal, sys, tempfile, time
import numpy as np
import dpkeras, keras

SPEC, VICTIM, KILL_AT = json.loads(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
STEPS, SAVE_FREQ, EPOCHS = int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
PLACEMENT = dpkeras.placement.hybrid() if sys.argv[7] == "hybrid" else None
keras.utils.set_random_seed(1)
with dpkeras.scope(cluster=SPEC, parameter_device=PLACEMENT):
    model = keras.Sequential([
        keras.Input((8,), dtype="int64"), keras.layers.Embedding(20_000, 32),
        keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
rng = np.random.RandomState(0)
n = STEPS * 256
x, y = rng.randint(0, 20_000, (n, 8)).astype("int64"), rng.rand(n, 1).astype("float32")


class Record(keras.callbacks.Callback):
    steps, killed_at = [], None

    def on_train_batch_end(self, batch, logs=None):
        now = time.time()
        step = int(self.model.optimizer.iterations.numpy())
        replicas = self.model.distribute_strategy.num_replicas_in_sync
        self.steps.append((now, step, replicas))
        if self.killed_at is None and step == KILL_AT:
            self.killed_at = time.time()
            os.kill(VICTIM, signal.SIGKILL)


record = Record()
backup = keras.callbacks.BackupAndRestore(tempfile.mkdtemp(), save_freq=SAVE_FREQ)
model.fit(x, y, batch_size=256, epochs=EPOCHS, verbose=0, callbacks=[backup, record])


def restored(v):  # a restore writes each copy of a replicated variable (placement.hybrid())
    copies = len(getattr(v.value, "copies", [v]))
    return copies * int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize


print(json.dumps({"steps": record.steps, "killed_at": record.killed_at,
                  "bytes": sum(map(restored, model.weights + model.optimizer.variables))}))
"""


def run_case(local, job, env, placement, kill_at):
    """Runs one client that kills task 1 of `job` after step `kill_at`, restarting the task
    once it is gone. Returns the client's record and the task's restart seconds."""
    from dpkeras.testing import server_env

    victim = local.procs[(job, 1)]
    argv = [sys.executable, "-c", _CLIENT, json.dumps(local.spec), str(victim.pid), str(kill_at)]
    argv += [str(FLAGS.steps_per_epoch), str(FLAGS.save_freq), str(FLAGS.epochs), placement]
    client = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**server_env(), **env}
    )
    try:
        deadline = time.monotonic() + 600
        while victim.poll() is None and client.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        started = time.time()
        local.restart(job, 1)
        restart = time.time() - started
        out, err = client.communicate(timeout=600)
    finally:
        if client.poll() is None:
            client.kill()
            client.communicate()
    if client.returncode != 0:
        tasks = "".join(
            f"\n--- {job}:{task} (exit {proc.poll()}) ---\n{local.stderr(job, task)[-1500:]}"
            for (job, task), proc in local.procs.items()
        )
        raise RuntimeError(f"the client failed ({client.returncode}):\n{err[-3000:]}{tasks}")
    # TensorFlow's collectives remember every worker's incarnation (each server's, for every
    # client after it), and after a ps's restart a hybrid client's collectives crashed a worker:
    # the workers are restarted too before the next case (docs/reliability.md).
    for task in range(len(local.spec["worker"])):
        if (job, task) != ("worker", 1):
            local.restart("worker", task)
    return json.loads(out.strip().splitlines()[-1]), restart


def summary(case, record, restart, kill_at):
    """The row of one case, from the client's step records."""
    steps = record["steps"]
    before = [b[0] - a[0] for a, b in zip(steps, steps[1:]) if b[1] <= kill_at and b[1] > 1]
    after = [s for s in steps if s[0] > record["killed_at"]]
    first = after[0]
    full = next((s for s in after if s[2] == steps[0][2]), None)
    return {
        "case": case,
        "step_s": statistics.median(before),
        "kill_to_next_step_s": first[0] - record["killed_at"],
        "task_restart_s": restart,
        "replicas_after": first[2],
        "kill_to_all_replicas_s": None if full is None else full[0] - record["killed_at"],
        "steps_trained_again": kill_at - (first[1] - 1),
        "restored_bytes": record["bytes"],
    }


def main(argv):
    del argv
    from dpkeras.testing import LocalCluster

    unknown = set(FLAGS.cases) - set(CASES)
    if unknown:
        raise app.UsageError(f"--cases: unknown {sorted(unknown)}; known: {list(CASES)}")
    # In the middle of the second epoch, 2 steps after a backup.
    kill_at = FLAGS.steps_per_epoch + 2 * FLAGS.save_freq + 2
    rows = []
    with LocalCluster(ps=2, workers=2, cpus=2) as local:
        for case in FLAGS.cases:
            job, env, placement = CASES[case]
            record, restart = run_case(local, job, env, placement, kill_at)
            rows.append(summary(case, record, restart, kill_at))
            print(json.dumps(rows[-1]), flush=True)
    os.makedirs(os.path.dirname(FLAGS.out) or ".", exist_ok=True)
    with open(FLAGS.out, "w") as f:
        json.dump({"kill_at": kill_at, "load": os.getloadavg(), "rows": rows}, f, indent=1)
    print(
        textwrap.dedent(f"""
        killed after step {kill_at} of {FLAGS.steps_per_epoch}-step epochs, backups every
        {FLAGS.save_freq} steps; load average at the end {os.getloadavg()[0]:.1f}""")
    )
    print(
        "| case | step (s) | kill -> next step (s) | on replicas | kill -> all replicas (s) "
        "| task restart (s) | steps trained again | bytes restored |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        back = "-" if r["kill_to_all_replicas_s"] is None else f"{r['kill_to_all_replicas_s']:.1f}"
        print(
            f"| {r['case']} | {r['step_s']:.3f} | {r['kill_to_next_step_s']:.1f} | "
            f"{r['replicas_after']} | {back} | {r['task_restart_s']:.1f} | "
            f"{r['steps_trained_again']} | {r['restored_bytes']:,} |"
        )


if __name__ == "__main__":
    app.run(main)
