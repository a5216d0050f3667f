"""A cluster's tasks: validating the cluster, reading TF_CONFIG, and naming tasks."""

import json
import os
import re

import tensorflow as tf

TF_CONFIG_ENV = "TF_CONFIG"
CLUSTER_JOBS = ("ps", "worker", "chief")
_ADDRESS = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(\d{1,5})$")


def task_name(job, index):
    """`("ps", 1)` -> `"/job:ps/replica:0/task:1"`, TensorFlow's name of a task."""
    return f"/job:{job}/replica:0/task:{index}"


def _normalize_job(job, tasks, source):
    """Returns the job's addresses as a list, in task order; raises for anything else."""
    if isinstance(tasks, dict):
        indices = sorted(tasks)
        if indices != list(range(len(indices))):
            raise ValueError(
                f"The tasks of job {job!r} must be numbered 0..n-1 without gaps. "
                f"Received task indices {indices} from {source}."
            )
        tasks = [tasks[i] for i in indices]
    if isinstance(tasks, str) or not isinstance(tasks, (list, tuple)):
        raise ValueError(
            f"Job {job!r} must be a list of 'host:port' addresses. "
            f"Received: {tasks!r} (of type {type(tasks).__name__}) from {source}."
        )
    if not tasks:
        raise ValueError(f"Job {job!r} has no task. Received: {job}=[] from {source}.")
    for address in tasks:
        match = _ADDRESS.match(address) if isinstance(address, str) else None
        if match is None or not 0 < int(match.group(2)) < 65536:
            raise ValueError(
                f"Every task of job {job!r} must be a 'host:port' address such as "
                f"'10.0.0.2:2222'. Received: {address!r} from {source}."
            )
    return list(tasks)


def _validate(cluster, source):
    """Checks a `{job: addresses}` mapping; returns it as a `tf.train.ClusterSpec`."""
    if not isinstance(cluster, dict) or not cluster:
        raise ValueError(
            f"A cluster must map job names to addresses, such as "
            f"{{'ps': ['10.0.0.1:2222'], 'worker': ['10.0.0.2:2222', '10.0.0.3:2222']}}. "
            f"Received: {cluster!r} from {source}."
        )
    unknown = [job for job in cluster if job not in CLUSTER_JOBS]
    if unknown:
        raise ValueError(
            f"Unknown job(s) {unknown} in the cluster from {source}; valid jobs: "
            f"{', '.join(CLUSTER_JOBS)}. Received jobs: {list(cluster)}."
        )
    if "worker" not in cluster:
        raise ValueError(
            f"A cluster must have a 'worker' job: workers run the replicas. Received jobs "
            f"{list(cluster)} from {source}."
        )
    jobs = {
        job: _normalize_job(job, cluster[job], source) for job in CLUSTER_JOBS if job in cluster
    }
    if len(jobs.get("chief", [])) > 1:
        raise ValueError(
            f"The 'chief' job is this process (the client): it has one task. Received "
            f"chief={jobs['chief']} from {source}."
        )
    seen = {}
    for job, addresses in jobs.items():
        for index, address in enumerate(addresses):
            name = task_name(job, index)
            if address in seen:
                raise ValueError(
                    f"Two tasks share the address {address}: {seen[address]} and {name} "
                    f"(from {source}). Every task needs its own port."
                )
            seen[address] = name
    return tf.train.ClusterSpec(jobs)


def _from_tf_config():
    raw = os.environ.get(TF_CONFIG_ENV)
    if raw is None or not raw.strip():
        return None
    source = f"{TF_CONFIG_ENV}={raw!r}"
    try:
        config = json.loads(raw)
    except ValueError as e:
        raise ValueError(f"{TF_CONFIG_ENV} is not valid JSON ({e}). Received: {source}.") from None
    if not isinstance(config, dict):
        raise ValueError(f"{TF_CONFIG_ENV} must be a JSON object. Received: {source}.")
    cluster = config.get("cluster")
    if not isinstance(cluster, dict) or not ({"ps", "worker"} & set(cluster)):
        return None
    task = config.get("task") or {}
    task_type = task.get("type") if isinstance(task, dict) else None
    if task_type not in (None, "chief"):
        raise ValueError(
            f"{TF_CONFIG_ENV} says this process is task {task_type!r} "
            f"(index {task.get('index')!r}), but a process that builds a model under dpkeras "
            f"is the client, task type 'chief' or no task. Start ps and worker tasks with "
            f"`dpkeras serve`, which reads {TF_CONFIG_ENV}. Received: {source}."
        )
    return _validate(cluster, source)


def load_cluster(text, what="the cluster"):
    """A cluster dict from a JSON object, or from the path of a file holding one.

    Args:
        text: str, JSON text or a file path.
        what: str, how error messages name the text (`dpkeras serve` says "--cluster").

    Raises:
        ValueError: naming the file or the text, when it cannot be read or parsed.
    """
    if text.lstrip().startswith("{"):
        source, raw = what, text
    else:
        source = f"{what} file {text!r}"
        try:
            with open(text, encoding="utf-8") as f:
                raw = f.read()
        except OSError as e:
            raise ValueError(
                f"cannot read {source}: {e.strerror}. Expected a JSON file path "
                f'or a JSON object such as \'{{"ps": ["host:2222"], '
                f'"worker": ["host:2223"]}}\'.'
            ) from None
    try:
        cluster = json.loads(raw)
    except ValueError as e:
        raise ValueError(f"{source} is not valid JSON ({e}). Received: {raw[:200]!r}") from None
    if not isinstance(cluster, dict):
        raise ValueError(
            f"{source} must hold a JSON object {{job: [addresses]}}. Received: {raw[:200]!r}"
        )
    return cluster


def resolve_cluster(cluster=None):
    """Returns the cluster to run on as a validated `tf.train.ClusterSpec`, or None.

    Jobs: `worker` (required: workers run the replicas), `ps` (optional: the tasks that hold
    variables; without it they live on the first worker) and `chief` (optional, one task: this
    process's own address, needed when the tasks run on other machines, since they send results
    back to the client). A cluster with `ps` only is refused: list the machine that computes as
    a worker.

    ```python
    spec = resolve_cluster({"ps": ["10.0.0.1:2222"],
                            "worker": ["10.0.0.2:2222", "10.0.0.3:2222"]})
    ```

    Args:
        cluster: a dict `{job: ["host:port", ...]}`, the same as JSON text or the path of a
            JSON file, a `tf.train.ClusterSpec`, a
            `tf.distribute.cluster_resolver.ClusterResolver`, or None. Defaults to None: the
            cluster of the `TF_CONFIG` environment variable if it names a `ps` or `worker` job
            (this process must then be task type `chief` or have no task), else no cluster.

    Returns:
        A `tf.train.ClusterSpec` with jobs listed as task-ordered address lists, or None when
        there is no cluster.

    Raises:
        ValueError: for an unknown job, a missing `worker` job, an empty job, an address that
            is not `host:port`, two tasks on one address, more than one chief, unparseable
            `TF_CONFIG`, or a `TF_CONFIG` naming this process as a ps or worker task.
    """
    if cluster is None:
        return _from_tf_config()
    source = "the cluster argument"
    if isinstance(cluster, str):
        source = f"the cluster argument {cluster[:100]!r}"
        cluster = load_cluster(cluster)
    if isinstance(cluster, tf.distribute.cluster_resolver.ClusterResolver):
        source = f"the cluster resolver {type(cluster).__name__}"
        cluster = cluster.cluster_spec()
        if not cluster.jobs:
            raise ValueError(f"{source} names no job; a cluster needs a 'worker' job.")
    if isinstance(cluster, tf.train.ClusterSpec):
        cluster = cluster.as_dict()
    elif not isinstance(cluster, dict):
        raise ValueError(
            f"A cluster must be a dict {{job: ['host:port', ...]}}, a tf.train.ClusterSpec or "
            f"a tf.distribute.cluster_resolver.ClusterResolver. Received: {cluster!r} "
            f"(of type {type(cluster).__name__})."
        )
    return _validate(cluster, source)


def task_addresses(cluster_spec):
    """`{task name: "host:port"}` for every task of the cluster, in job order (ps, worker)."""
    return {
        task_name(job, i): address
        for job in cluster_spec.jobs
        for i, address in enumerate(cluster_spec.job_tasks(job))
    }


def remote_tasks(cluster_spec):
    """The tasks this process connects to (every task but the chief, which it is)."""
    return {
        name: address
        for name, address in task_addresses(cluster_spec).items()
        if not name.startswith("/job:chief/")
    }
