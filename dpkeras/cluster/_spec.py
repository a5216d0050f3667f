"""A cluster's tasks: validating the cluster, reading TF_CONFIG, and naming tasks.

`cluster_of` is the one place a cluster is read: it returns a `Cluster`, a `tf.train.ClusterSpec`
that carries every fact dpkeras needs about it (its tasks, the client, the tasks to connect to,
this process's role), so the modules a cluster goes through on its way from
`dpkeras.scope(cluster=...)` read them and none asks this module again.
"""

import json
import re
import warnings

import tensorflow as tf

from dpkeras import _config

TF_CONFIG_ENV = _config.VARIABLES["tf_config"]
# "master" is the older name of "chief" (Kubeflow's TFJob still writes it): the client's task.
CLUSTER_JOBS = ("ps", "worker", "chief", "master")
CLIENT_JOBS = ("chief", "master")
# Listed in a cluster by TFJob but not part of synchronous training: left out of it.
IGNORED_JOBS = ("evaluator",)
_ADDRESS = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(\d{1,5})$")


def task_name(job, index):
    """`("ps", 1)` -> `"/job:ps/replica:0/task:1"`, TensorFlow's name of a task."""
    return f"/job:{job}/replica:0/task:{index}"


def _normalize_job(job, tasks, source):
    """Returns the job's addresses as a list, in task order; raises for anything else."""
    if isinstance(tasks, dict):
        try:
            by_index = {int(i): address for i, address in tasks.items()}
        except (TypeError, ValueError):
            by_index = {}
        indices = sorted(by_index)
        if not by_index or indices != list(range(len(indices))):
            sparse = (
                f" A sparse {TF_CONFIG_ENV} (Kubeflow TFJob's enableDynamicWorker gives each "
                f"worker only its own address) cannot drive in-graph training, which needs every "
                f"worker's address: turn enableDynamicWorker off."
                if TF_CONFIG_ENV in source
                else ""
            )
            raise ValueError(
                f"The tasks of job {job!r} must be numbered 0..n-1 without gaps. "
                f"Received task indices {sorted(tasks)} from {source}.{sparse}"
            )
        tasks = [by_index[i] for i in indices]
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
    cluster = {job: tasks for job, tasks in cluster.items() if job not in IGNORED_JOBS}
    unknown = [job for job in cluster if job not in CLUSTER_JOBS]
    if unknown:
        raise ValueError(
            f"Unknown job(s) {unknown} in the cluster from {source}; valid jobs: "
            f"{', '.join(CLUSTER_JOBS + IGNORED_JOBS)}. Received jobs: {list(cluster)}."
        )
    if "worker" not in cluster:
        raise ValueError(
            f"A cluster must have a 'worker' job: workers run the replicas. Received jobs "
            f"{list(cluster)} from {source}."
        )
    jobs = {
        job: _normalize_job(job, cluster[job], source) for job in CLUSTER_JOBS if job in cluster
    }
    if "chief" in jobs and "master" in jobs:
        raise ValueError(
            f"A cluster names its client 'chief' or 'master' (the older name), not both. "
            f"Received chief={jobs['chief']} and master={jobs['master']} from {source}."
        )
    for job in CLIENT_JOBS:
        if len(jobs.get(job, [])) > 1:
            raise ValueError(
                f"The {job!r} job is the client: it has one task. Received "
                f"{job}={jobs[job]} from {source}."
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


def parse_tf_config(raw):
    """`TF_CONFIG`'s text (`dpkeras._config.Config.tf_config`) parsed, with its source for
    messages; `(None, None)` for None.

    Raises:
        ValueError: for text that is not a JSON object, naming it.
    """
    if raw is None:
        return None, None
    source = f"{TF_CONFIG_ENV}={raw!r}"
    try:
        config = json.loads(raw)
    except ValueError as e:
        raise ValueError(f"{TF_CONFIG_ENV} is not valid JSON ({e}). Received: {source}.") from None
    if not isinstance(config, dict):
        raise ValueError(f"{TF_CONFIG_ENV} must be a JSON object. Received: {source}.")
    return config, source


def _tf_config():
    """This process's cluster and task, as `TF_CONFIG` gives them, with their source for
    messages: those given to `join` (`take_task`), else `TF_CONFIG` parsed; `(None, None)`
    when neither."""
    if _given is not None:
        return _given
    return parse_tf_config(_config.setting("tf_config").value)


# TF1's between-graph recipe (TensorFlow's mnist_replica.py) names a task with these flags.
FLAG_JOBS = ("ps", "worker")
_given = None  # `(TF_CONFIG's dict, source)` of the task given to `join` (`take_task`), or None


def task_origin():
    """Where this process's task comes from, for messages: "in TF_CONFIG", or "given to
    dpkeras.cluster.join()" (its `job_name` and `task_index`)."""
    return f"in {TF_CONFIG_ENV}" if _given is None else "given to dpkeras.cluster.join()"


def _hosts(name, hosts):
    """`ps_hosts` or `worker_hosts` as a list of addresses: a comma-separated string (TF1's
    flags) or a list of strings (absl's `DEFINE_list`)."""
    if isinstance(hosts, str):
        addresses = [address.strip() for address in hosts.split(",")]
    elif isinstance(hosts, (list, tuple)) and all(isinstance(a, str) for a in hosts):
        addresses = [address.strip() for address in hosts]
    else:
        raise ValueError(
            f"{name} must be 'host:port' addresses, comma-separated in a string or in a list. "
            f"Received: {name}={hosts!r} (of type {type(hosts).__name__})."
        )
    if not all(addresses):
        what = "is empty" if not any(addresses) else "has an empty address"
        raise ValueError(
            f"{name} {what}: give every task's 'host:port', comma-separated, such as "
            f"'10.0.0.1:2222,10.0.0.2:2222'. Received: {name}={hosts!r}."
        )
    return addresses


def _task_index(task_index):
    if isinstance(task_index, str) and task_index.strip().isdecimal():
        return int(task_index)
    if isinstance(task_index, bool) or not isinstance(task_index, int) or task_index < 0:
        raise ValueError(
            f"task_index must be an integer >= 0. Received: task_index={task_index!r} "
            f"(of type {type(task_index).__name__})."
        )
    return task_index


def task_given(cluster=None, job_name=None, task_index=None, ps_hosts=None, worker_hosts=None):
    """This process's task as `join` takes it (TF1's flags), as `TF_CONFIG` would give it.

    Args:
        cluster: the cluster (what `cluster_spec_of` takes), or None with `ps_hosts` and
            `worker_hosts`.
        job_name: str, this process's job: "ps" or "worker" (with `cluster`, any of its jobs).
        task_index: int (or a string of digits), this process's index in its job.
        ps_hosts, worker_hosts: the jobs' addresses, comma-separated in a string or in a list;
            `ps_hosts` None: a cluster without ps.

    Returns:
        `(TF_CONFIG's dict, source)`, or None when neither `job_name`, `task_index`,
        `ps_hosts` nor `worker_hosts` is given.

    Raises:
        ValueError: naming what was received and what is valid, for a missing `job_name`,
            `task_index` or `worker_hosts`, an unknown job, an index out of range, empty hosts,
            or a `cluster` given with `ps_hosts` or `worker_hosts`.
    """
    flags = {
        "job_name": job_name,
        "task_index": task_index,
        "ps_hosts": ps_hosts,
        "worker_hosts": worker_hosts,
    }
    if all(value is None for value in flags.values()):
        return None
    shown = ", ".join(f"{name}={value!r}" for name, value in flags.items() if value is not None)
    if cluster is not None:
        if ps_hosts is not None or worker_hosts is not None:
            raise ValueError(
                f"join() takes the cluster or ps_hosts and worker_hosts, not both. Received: "
                f"cluster={cluster!r}, {shown}."
            )
        spec = cluster_spec_of(cluster)
        source = f"join(cluster, {shown})"
    else:
        if worker_hosts is None:
            raise ValueError(
                f"worker_hosts is missing: with job_name and task_index, join() needs the "
                f"workers' addresses (and ps_hosts, the ps tasks'), or a cluster. Received: "
                f"{shown}."
            )
        jobs = {"worker": _hosts("worker_hosts", worker_hosts)}
        if ps_hosts is not None:
            jobs = {"ps": _hosts("ps_hosts", ps_hosts), **jobs}
        source = f"join({shown})"
        spec = _validate(jobs, source)
    missing = [name for name in ("job_name", "task_index") if flags[name] is None]
    if missing:
        raise ValueError(
            f"{' and '.join(missing)} missing: join() needs job_name and task_index, this "
            f"process's task, with the cluster's addresses. Received: {shown}."
        )
    valid = [job for job in (FLAG_JOBS if cluster is None else CLUSTER_JOBS) if job in spec.jobs]
    if job_name not in valid:
        raise ValueError(
            f"job_name must be {' or '.join(repr(j) for j in valid)}, a job of the cluster "
            f"given. Received: job_name={job_name!r}."
        )
    index = _task_index(task_index)
    tasks = spec.job_tasks(job_name)
    if index >= len(tasks):
        raise ValueError(
            f"task_index {index} is out of range: job {job_name!r} has {len(tasks)} task(s), "
            f"indices 0..{len(tasks) - 1}. Received: {shown}."
        )
    config = {"cluster": spec.as_dict(), "task": {"type": job_name, "index": index}}
    return config, source


def take_task(config, source):
    """Makes `config` (from `task_given`) this process's cluster and task, as `TF_CONFIG`
    would: `join()`, `dpkeras.scope()` and every door read it from then on.

    Raises:
        ValueError: when `TF_CONFIG` names another cluster or task, or an earlier `join` gave
            another one: a process is one task for its lifetime.
    """
    global _given
    cluster = tf.train.ClusterSpec(config["cluster"]).as_dict()
    task = (config["task"]["type"], config["task"]["index"])
    if _given is not None:
        if _given[0] != config:
            raise ValueError(
                f"This process already joined as {task_name(*_given[0]['task'].values())} of "
                f"{_given[0]['cluster']} ({_given[1]}); a process is one task for its "
                f"lifetime. Received: {source}."
            )
        return
    environment, env_source = parse_tf_config(_config.setting("tf_config").value)
    theirs = None if environment is None else environment.get("cluster")
    if isinstance(theirs, dict) and {"ps", "worker"} & set(theirs):
        their_task = environment.get("task") if isinstance(environment.get("task"), dict) else {}
        their_task = (their_task.get("type"), their_task.get("index", 0))
        their_cluster = _validate(theirs, env_source).as_dict()
        if their_cluster != cluster or their_task != task:
            their_name = "no task" if their_task[0] is None else task_name(*their_task)
            raise ValueError(
                f"This process is given its task twice, and the two differ: {source} makes it "
                f"{task_name(*task)} of {cluster}; {TF_CONFIG_ENV} makes it {their_name} of "
                f"{their_cluster}. Give one: unset {TF_CONFIG_ENV}, or call join() without "
                f"job_name and task_index. Received: {env_source}."
            )
    _given = (config, source)


def _from_tf_config():
    config, source = _tf_config()
    cluster = None if config is None else config.get("cluster")
    if not isinstance(cluster, dict) or not ({"ps", "worker"} & set(cluster)):
        return None
    return _validate(cluster, source)


def tf_config_task():
    """`(task type, index)` of this process from `TF_CONFIG`, or None (no `TF_CONFIG`, no
    cluster in it, or no task)."""
    config, source = _tf_config()
    if config is None or _from_tf_config() is None:
        return None
    task = config.get("task")
    if not isinstance(task, dict) or task.get("type") is None:
        return None
    job, index = task.get("type"), task.get("index", 0)
    if job not in CLUSTER_JOBS + IGNORED_JOBS or not isinstance(index, int) or index < 0:
        raise ValueError(
            f"{TF_CONFIG_ENV}'s task must have a type among "
            f"{', '.join(CLUSTER_JOBS + IGNORED_JOBS)} and an index >= 0. Received: "
            f"task={task!r} from {source}."
        )
    tasks = _from_tf_config().job_tasks(job) if job in _from_tf_config().jobs else []
    if job not in IGNORED_JOBS and index >= len(tasks):
        have = f"tasks 0..{len(tasks) - 1}" if tasks else "no task"
        raise ValueError(
            f"{TF_CONFIG_ENV}'s task is {job} {index}, but its cluster's {job!r} job has "
            f"{have}: list this task's address in the cluster, or fix the index. Received: "
            f"task={task!r} from {source}."
        )
    return job, index


def client_job(cluster_spec):
    """The job that names the client in `cluster_spec`, `chief` or `master`; None if neither."""
    return next((job for job in CLIENT_JOBS if job in cluster_spec.jobs), None)


def client_task(cluster_spec):
    """`(job, index)` of the client's own task in `cluster_spec`, or None (job `localhost`).

    The client is the `chief` (or `master`) task; with neither, it is worker 0 when
    `TF_CONFIG` says this process is worker 0 of this cluster (Kubeflow's layout without a
    chief: worker 0 leads, and its devices compute too).
    """
    job = client_job(cluster_spec)
    if job is not None:
        return job, 0
    if tf_config_task() == ("worker", 0) and _from_tf_config().as_dict() == cluster_spec.as_dict():
        return "worker", 0
    return None


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


def cluster_spec_of(cluster=None):
    """Returns the cluster to run on as a validated `tf.train.ClusterSpec`, or None.

    Jobs: `worker` (required: workers run the replicas), `ps` (optional: the tasks that hold
    variables; without it they live on the first worker) and `chief` or `master` (optional, one
    task: the client's own address, needed when the tasks run on other machines, since they
    send results back to the client). An `evaluator` job (Kubeflow's TFJob lists it) is left
    out: it takes no part in synchronous training. A cluster with `ps` only is refused: list
    the machine that computes as a worker.

    ```python
    spec = cluster_spec_of({"ps": ["10.0.0.1:2222"],
                            "worker": ["10.0.0.2:2222", "10.0.0.3:2222"]})
    ```

    Args:
        cluster: a dict `{job: ["host:port", ...]}`, the same as JSON text or the path of a
            JSON file, a `tf.train.ClusterSpec`, a
            `tf.distribute.cluster_resolver.ClusterResolver`, or None. Defaults to None: the
            cluster of the `TF_CONFIG` environment variable if it names a `ps` or `worker` job,
            else no cluster.

    Returns:
        A `tf.train.ClusterSpec` with jobs listed as task-ordered address lists, or None when
        there is no cluster.

    Raises:
        ValueError: for an unknown job, a missing `worker` job, an empty job, an address that
            is not `host:port`, two tasks on one address, more than one chief (or both chief
            and master), unparseable `TF_CONFIG`, or a sparse one (TFJob's
            enableDynamicWorker).
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


def resolve_cluster(cluster=None):
    """Deprecated since 0.4.0 (removed in 0.5.0): `cluster_spec_of`, its name since then."""
    warnings.warn(
        "dpkeras.cluster.resolve_cluster is deprecated and will be removed in dpkeras 0.5.0; "
        "it is dpkeras.cluster.cluster_spec_of, with the same arguments and result.",
        DeprecationWarning,
        stacklevel=2,
    )
    return cluster_spec_of(cluster)


def task_addresses(cluster_spec):
    """`{task name: "host:port"}` for every task of the cluster, in job order (ps, worker)."""
    return {
        task_name(job, i): address
        for job in cluster_spec.jobs
        for i, address in enumerate(cluster_spec.job_tasks(job))
    }


class Cluster(tf.train.ClusterSpec):
    """A validated cluster and the facts dpkeras reads about it, computed once (`cluster_of`).

    Attributes:
        tasks: `{task name: "host:port"}` of every task, in job order.
        client: `(task name, "host:port")` of the client's task: the chief or master; with
            neither, worker 0, which leads in that layout.
        own: `(job, index)` of the task this process is when it is the client and one of the
            cluster's tasks (see `client_task`), else None (it connects as `localhost`).
        remote: `{task name: "host:port"}` of the tasks a client connects to (all but `own`).
        training: `{task name: "host:port"}` of the ps and worker tasks.
        serves_as: `(job, index)` when `TF_CONFIG` makes this process a task other than the
            client (it serves, see `dpkeras.cluster.join`), else None.
        ends_tasks: whether this client is its own task of `TF_CONFIG` (one program in every
            task): at its exit it ends the other tasks.
    """

    def __init__(self, cluster_spec, own=None, serves_as=None, ends_tasks=False):
        super().__init__(cluster_spec)
        self.tasks = task_addresses(self)
        client = task_name(client_job(self) or "worker", 0)
        self.client = (client, self.tasks[client])
        self.own = own
        own_name = None if own is None else task_name(*own)
        self.remote = {n: a for n, a in self.tasks.items() if n != own_name}
        self.training = {
            n: a for n, a in self.tasks.items() if n.split("/")[1][4:] in ("ps", "worker")
        }
        self.serves_as = serves_as
        self.ends_tasks = ends_tasks


def cluster_of(cluster=None):
    """The `Cluster` of `cluster` (see `cluster_spec_of` for what it accepts), or None.

    A `Cluster` is returned as it is. With `cluster` None, `TF_CONFIG` also says this
    process's task: a task other than the client is `serves_as`.
    """
    if isinstance(cluster, Cluster):
        return cluster
    spec = cluster_spec_of(cluster)
    if spec is None:
        return None
    own = client_task(spec)
    this = tf_config_task() if cluster is None or own is not None else None
    serves_as = None if cluster is not None else this
    if serves_as is not None and (serves_as[0] in CLIENT_JOBS or serves_as == own):
        serves_as = None
    return Cluster(spec, own=own, serves_as=serves_as, ends_tasks=own is not None and this == own)
