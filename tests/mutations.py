"""Mutation check: break dpkeras on purpose, one named way at a time, and expect the tests that
guard each behaviour to fail. A script, not a test module (pytest collects `test_*.py` only):

    .venv/bin/python -m tests.mutations            # every mutant (`make mutants`)
    .venv/bin/python -m tests.mutations resume     # only the named ones

For each mutant it copies the checkout (without .venv and .git) to a scratch directory,
replaces one small exact text in one file (a dpkeras module, or pyproject.toml; asserted to
occur exactly once, so a mutant whose code moved fails loudly instead of testing nothing), and
runs the named tests there with PYTHONPATH pointing at the copy, so the mutant is what the
tests and the processes they start (clients, `dpkeras serve` tasks) import. A mutant is caught
when its tests fail. It prints a table and exits 1 if a mutant survives, 2 if one no longer
applies.
"""

import dataclasses
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEST_TIMEOUT = 1800  # seconds per mutant: a cluster module starts its own 4-task cluster


@dataclasses.dataclass(frozen=True)
class Mutant:
    """One break: in `path`, `old` (occurring exactly once) becomes `new`; `tests` must fail."""

    name: str
    what: str
    path: str
    old: str
    new: str
    tests: tuple


# The README's row of BatchNormalization(synchronized=True) in "What is exact".
ROW_SYNC_BN = (
    "| `BatchNormalization(synchronized=True)` (statistics over the global batch; the default "
    "`synchronized=False` is per replica under every strategy) | exact | exact |\n"
)

MUTANTS = (
    Mutant(
        "sum",
        "gradients averaged instead of summed on the parameter device",
        "dpkeras/_variables/variables.py",
        '"SUM", grad, self.device',
        '"MEAN", grad, self.device',
        (
            "tests/test_equivalence.py::test_training_actually_moves_the_weights",
            "tests/test_equivalence.py::test_replicas_equal_one_device[dense-sgd-2]",
        ),
    ),
    Mutant(
        "sum-clipped",
        "the same break, seen where clipping is active on some steps only, and in bfloat16",
        "dpkeras/_variables/variables.py",
        '"SUM", grad, self.device',
        '"MEAN", grad, self.device',
        (
            "tests/test_optimizer_apply.py::test_equals_one_device[clipnorm-some-steps]",
            "tests/test_optimizer_apply.py::test_equals_one_device[global_clipnorm-some-steps]",
            "tests/test_semantics.py::test_mixed_precision_trains_like_one_device",
        ),
    ),
    Mutant(
        "rows-only",
        "a lookup reads the whole table into the replica, then gathers there",
        "dpkeras/_variables/lookups.py",
        "return table.sparse_read(indices, name=name)",
        "return tf.gather(table.read_value(), indices, name=name)",
        (
            "tests/test_semantics.py::test_embedding_rows_travel_not_the_table",
            "tests/test_sharding.py::test_a_step_moves_looked_up_rows_never_the_table_or_a_shard",
        ),
    ),
    Mutant(
        "rows-only-cluster",
        "the same break, on a cluster: the table crosses from the ps to the workers",
        "dpkeras/_variables/lookups.py",
        "return table.sparse_read(indices, name=name)",
        "return tf.gather(table.read_value(), indices, name=name)",
        (
            "tests/test_cluster_training.py::"
            "test_only_looked_up_rows_of_a_table_cross_between_ps_and_workers",
        ),
    ),
    Mutant(
        "dedup",
        "a lookup sends every id, repeats included (no deduplication)",
        "dpkeras/_variables/dedup.py",
        "    return tf.unique(tf.reshape(indices, [-1]))\n",
        "    flat = tf.reshape(indices, [-1])\n    return flat, tf.range(tf.size(flat))\n",
        (
            "tests/test_dedup.py::"
            "test_under_sgd_each_replica_sends_only_its_distinct_ids_both_ways",
            "tests/test_cluster_loop.py::test_each_distinct_id_crosses_once_per_worker_each_way",
        ),
    ),
    Mutant(
        "dedup-sum",
        "gradient rows of repeated ids summed before every optimizer (Adam's numbers change)",
        "dpkeras/_variables/dedup.py",
        "    if mode is Deduplicate.SUM:\n        return True\n",
        "    if True:\n        return True\n",
        ("tests/test_dedup.py::test_by_default_every_optimizer_equals_one_device[plain-adam]",),
    ),
    Mutant(
        "task-pulls",
        "a worker's replicas each pull their own rows (no merge per task)",
        "dpkeras/_variables/task_pulls.py",
        "    return extended.cluster_spec is not None and any(",
        "    return False and any(",
        (
            "tests/test_task_pulls.py::"
            "test_replicas_of_one_worker_share_one_pull_of_each_distinct_id",
        ),
    ),
    Mutant(
        "metric-sync",
        "a metric counts replica 0's update only",
        "dpkeras/_variables/writes.py",
        "aggregate(self.aggregation, per_replica_delta, self.device)",
        'aggregate("ONLY_FIRST_REPLICA", per_replica_delta, self.device)',
        ("tests/test_semantics.py::test_metrics_accumulate_like_one_device",),
    ),
    Mutant(
        "resume",
        "BackupAndRestore restores nothing (a rerun trains from scratch)",
        "dpkeras/_patches/resume.py",
        "    if not _backup_applies(callback):\n        return original(callback, logs)\n",
        "    if True:  # mutant: no restore\n        return None\n",
        (
            "tests/test_cluster_training.py::"
            "test_a_task_killed_mid_fit_fails_fast_and_the_run_resumes_exactly[worker-epoch]",
        ),
    ),
    Mutant(
        "monitor",
        "the strategy starts no health monitor on a cluster",
        "dpkeras/_extended/extended.py",
        "_health.watch(cluster)",
        "pass",
        (
            "tests/test_cluster_training.py::"
            "test_a_frozen_task_ends_the_client_through_the_strategy_s_own_monitor",
        ),
    ),
    Mutant(
        "dead-task",
        "a lost task's TensorFlow error is not named (no TaskFailedError)",
        "dpkeras/cluster/_health.py",
        "        if not isinstance(error, (tf.errors.OpError, ValueError)):\n",
        "        if True:\n",
        (
            "tests/test_cluster_training.py::"
            "test_a_task_killed_mid_fit_fails_fast_and_the_run_resumes_exactly[ps-epoch]",
        ),
    ),
    Mutant(
        "dead-from-text",
        "a task that answers is called dead because an error's gRPC text names it (the old bug)",
        "dpkeras/cluster/_health.py",
        "        dead = failed_tasks(self._cluster)\n",
        "        dead = failed_tasks(self._cluster) or {\n"
        "            t: 'named' for t in self._cluster.remote if f'target {t}' in str(error)\n"
        "        }\n",
        (
            "tests/test_cluster.py::test_an_error_naming_a_task_that_answers_passes_through",
            "tests/test_cluster_loop.py::"
            "test_an_ordinary_error_on_a_healthy_cluster_is_itself_and_the_next_fit_trains",
        ),
    ),
    Mutant(
        "restart-unseen",
        "a restarted task (it answers probes, lost the client's context) is not named",
        "dpkeras/cluster/_health.py",
        "        if name in connected:\n",
        "        if False:\n",
        ("tests/test_cluster.py::test_a_restarted_task_is_named_from_its_state",),
    ),
    Mutant(
        "wheel-drops-subpackage",
        "the package configuration leaves dpkeras.tf1 out of the wheel",
        "pyproject.toml",
        'include = ["dpkeras*"]',
        'include = ["dpkeras", "dpkeras._*", "dpkeras.cluster", "dpkeras.testing"]',
        ("tests/test_wheel.py::test_the_wheel_holds_every_module_of_dpkeras_and_nothing_else",),
    ),
    Mutant(
        "dedup-clip",
        "SGD with clipvalue sums a repeated id's gradient rows before clipping (Keras clips each)",
        "dpkeras/_variables/dedup.py",
        "        and optimizer.clipvalue is None\n",
        "",
        (
            "tests/test_dedup.py::"
            "test_clipping_sees_each_repeated_id_s_rows_as_one_device_does[sgd_clipvalue]",
        ),
    ),
    Mutant(
        "evict-newest",
        "lru and ttl free the most recently seen row instead of the least",
        "dpkeras/_dynamic/policy.py",
        "order = tf.argsort(recency, stable=True)",
        "order = tf.argsort(-recency, stable=True)",
        (
            "tests/test_dynamic_embedding.py::"
            "test_a_full_table_frees_the_least_recently_seen_row_neither_the_lowest_nor_the_newest",
        ),
    ),
    Mutant(
        "reset-first-slot",
        "a DynamicEmbedding row handed to a new id resets its first optimizer slot only",
        "dpkeras/_dynamic/slots.py",
        "    for slot, value in plan:\n",
        "    for slot, value in plan[:1]:\n",
        ("tests/test_dynamic_embedding.py::test_a_reused_row_restarts_every_adam_slot",),
    ),
    Mutant(
        "export-shard-0",
        "a sharded DynamicEmbedding index exports shard 0's table only (weights files lose ids)",
        "dpkeras/_dynamic/tables.py",
        "        exported = []\n        for table, device in zip(self.tables, self.devices):\n",
        "        exported = []\n        for table, device in zip(self.tables[:1], self.devices):\n",
        (
            "tests/test_dynamic_embedding.py::"
            "test_weights_files_of_a_sharded_index_hold_every_shard_s_ids",
        ),
    ),
    Mutant(
        "client-absent",
        "a task whose client never starts ends with status 0 (success) instead of 75",
        "dpkeras/cluster/_task.py",
        '{CLIENT_GONE}.",\n                file=sys.stderr,\n                flush=True,\n'
        "            )\n            return CLIENT_GONE\n    print(",
        '{CLIENT_GONE}.",\n                file=sys.stderr,\n                flush=True,\n'
        "            )\n            return 0\n    print(",
        (
            "tests/test_serve.py::"
            "test_a_task_whose_client_never_starts_ends_with_status_75_after_the_start_timeout",
        ),
    ),
    Mutant(
        "client-timeout",
        "a task ignores $DPKERAS_CLIENT_START_TIMEOUT (waits the 1800 s default for its client)",
        "dpkeras/cluster/_task.py",
        "time.monotonic() + (start_timeout or _config.DEFAULT_CLIENT_START_TIMEOUT)",
        "time.monotonic() + _config.DEFAULT_CLIENT_START_TIMEOUT",
        (
            "tests/test_serve.py::"
            "test_a_task_whose_client_never_starts_ends_with_status_75_after_the_start_timeout",
        ),
    ),
    Mutant(
        "no-chief-watch",
        "without a chief, the tasks watch ps 0 instead of worker 0 (the client)",
        "dpkeras/cluster/_spec.py",
        'task_name(client_job(self) or "worker", 0)',
        'task_name(client_job(self) or "ps", 0)',
        (
            "tests/test_launch.py::test_the_roles_read_from_tf_config",
            "tests/test_serve.py::test_under_tf_config_without_a_chief_serve_watches_worker_0",
            "tests/test_launch.py::test_a_client_that_fails_ends_every_task_with_status_75[worker]",
        ),
    ),
    Mutant(
        "cluster-evaluate",
        "on a cluster, evaluate runs Keras's own loop from the client (fit's stays on a task)",
        "dpkeras/_patches/table.py",
        'for step in ("train", "test", "predict")',
        'for step in ("train", "predict")',
        (
            "tests/test_cluster_loop.py::test_evaluate_and_predict_run_on_a_task_as_fit_does",
            "tests/test_cluster_loop.py::test_evaluate_sends_once_per_execution_not_once_per_step",
        ),
    ),
    Mutant(
        "cluster-predict",
        "on a cluster, predict runs Keras's own loop from the client (fit's stays on a task)",
        "dpkeras/_patches/table.py",
        'for step in ("train", "test", "predict")',
        'for step in ("train", "test")',
        ("tests/test_cluster_loop.py::test_evaluate_and_predict_run_on_a_task_as_fit_does",),
    ),
    Mutant(
        "auto-shard",
        "on a cluster, AUTO does not split the input: every worker maps every element (exact)",
        "dpkeras/_input/plan.py",
        "        pipelines = sharding.host_pipelines(dataset, ranges, self.num_replicas)\n",
        "        pipelines = None\n",
        (
            "tests/test_cluster_loop.py::"
            "test_each_worker_maps_its_share_and_training_equals_one_process",
        ),
    ),
    Mutant(
        "last-group",
        "the workers' pipelines end before the last, short batch: with 4 steps and K=3, the "
        "last group of steps is dropped",
        "dpkeras/_input/sharding.py",
        "    last = 0 if full is None or cut.drop_remainder else cut.elements % b\n",
        "    last = 0\n",
        ("tests/test_cluster_loop.py::test_every_steps_per_execution_equals_one_process[3]",),
    ),
    Mutant(
        "jit-predict",
        "predict with jit_compile=True compiles each replica's step (Keras's way), not the whole",
        "dpkeras/_patches/xla.py",
        "        or not model.jit_compile\n",
        "        or True\n",
        ("tests/test_jit_predict.py::test_jit_predict_equals_one_device",),
    ),
    Mutant(
        "composite-rows",
        "gradient weights count the rows of the first per-replica input, None included",
        "dpkeras/_extended/keras_steps.py",
        "        if all(batch_rows.has_rows(c) for c in components):\n",
        "        if True:\n",
        (
            "tests/test_composite_inputs.py::"
            "test_uneven_batches_of_composite_inputs_equal_one_device",
        ),
    ),
    Mutant(
        "empty-share",
        "predict runs the model on a replica's empty share of a batch",
        "dpkeras/_extended/extended.py",
        '        if step == "predict_step" and n > 1:\n',
        "        if False:\n",
        ("tests/test_empty_share.py::test_predict_with_empty_replica_shares_equals_one_device",),
    ),
    Mutant(
        "dataset-before-join",
        "datasets made before joining a cluster are not remembered (TF's raw error at fit)",
        "dpkeras/cluster/_connect.py",
        "        _remember_datasets_made_before()\n",
        "        pass\n",
        (
            "tests/test_dataset_before_join.py::"
            "test_pipelines_made_before_joining_are_refused_and_made_after_train",
        ),
    ),
    Mutant(
        "python-on-workers",
        "a pipeline that calls Python is sent to the workers, which have no Python for it",
        "dpkeras/_input/plan.py",
        "        if len(self.hosts) > 1 and _tf_internals.runs_python(dataset):\n",
        "        if False:\n",
        (
            "tests/test_dataset_before_join.py::"
            "test_pipelines_made_before_joining_are_refused_and_made_after_train",
        ),
    ),
    Mutant(
        "cluster-sparse-slices",
        "on a cluster, a global batch's SparseTensor is sliced with [lo:hi] (which it refuses)",
        "dpkeras/_input/batch_rows.py",
        "    if isinstance(x, tf.SparseTensor):\n        lo, hi =",
        "    if False:\n        lo, hi =",
        ("tests/test_cluster_inputs.py::test_uneven_composite_inputs_equal_one_device[sparse]",),
    ),
    Mutant(
        "cluster-none-rows",
        "on a cluster, a global batch's rows are counted on its first component, even None",
        "dpkeras/_input/sharding.py",
        "rows = batch_rows.rows(batch_rows.first_in_batch(batch), tf.int64)",
        "rows = tf.shape(tf.nest.flatten(batch)[0], out_type=tf.int64)[0]",
        ("tests/test_cluster_inputs.py::test_uneven_composite_inputs_equal_one_device[none]",),
    ),
    Mutant(
        "empty-share-cond",
        "predict picks the row of zeros for an empty share with a tf.cond (a merge_call inside)",
        "dpkeras/_extended/keras_steps.py",
        "        return tf.nest.map_structure(its_rows, fn(*padded_args, **padded_kwargs))\n",
        "        return tf.cond(rows > 0, lambda: fn(*args, **kwargs), lambda: "
        "tf.nest.map_structure(its_rows, fn(*padded_args, **padded_kwargs)))\n",
        (
            "tests/test_cluster_inputs.py::"
            "test_predict_on_every_batch_size_with_empty_shares_equals_one_device",
        ),
    ),
    Mutant(
        "dynamic-ragged",
        "DynamicEmbedding converts ragged ids to a dense tensor",
        "dpkeras/_dynamic/layer.py",
        "        if isinstance(inputs, tf.RaggedTensor):\n",
        "        if False:\n",
        (
            "tests/test_dynamic_embedding.py::"
            "test_ragged_ids_give_ragged_vectors_and_train_as_one_device",
            "tests/test_cluster_inputs.py::"
            "test_uneven_composite_inputs_equal_one_device[ragged-dynamic-adam]",
        ),
    ),
    Mutant(
        "cluster-jit",
        "on a cluster, a model compiled with jit_compile=True gets XLA-compiled steps",
        "dpkeras/_variables/placed.py",
        "    if extended.cluster_spec is None:\n        return None\n",
        "    if True:\n        return None\n",
        ("tests/test_cluster_inputs.py::test_jit_compiled_predict_and_fit_equal_one_device",),
    ),
    Mutant(
        "assign-sub",
        "a variable's assign_sub adds (Keras's SGD and Adam update with assign_sub)",
        "dpkeras/_variables/writes.py",
        '"assign_sub", delta, use_locking',
        '"assign_add", delta, use_locking',
        ("tests/test_keras_suite.py::test_keras_own_tests_differ_under_dpkeras_only_as_pinned",),
    ),
    Mutant(
        "whole-batch-predict",
        "a Keras step handed one whole batch runs it on every replica (predict_on_batch rows "
        "come back once per replica; fit on CPU replicas counts each row N times)",
        "dpkeras/_extended/extended.py",
        "            if n > 1 and keras_steps.is_whole_batch(args, kwargs):\n",
        "            if False:\n",
        (
            "tests/test_predict_on_batch.py::"
            "test_predict_on_batch_equals_one_device_for_every_batch_size",
            "tests/test_whole_batches.py::"
            "test_train_and_test_on_batch_run_each_replica_on_its_share",
            "tests/test_whole_batches.py::test_fit_on_whole_batches_equals_one_device",
        ),
    ),
    Mutant(
        "iterator-per-epoch",
        "on CPU replicas Keras's epoch loop makes TensorFlow's distributed iterator each epoch",
        "dpkeras/_patches/whole_batches.py",
        "    if extended is None or not extended.input_plan.reads_whole_batches():\n",
        "    if True:\n",
        ("tests/test_whole_batches.py::test_a_second_fit_and_evaluate_make_no_function",),
    ),
    Mutant(
        "noisy-serve",
        "a task serving from join() or `dpkeras serve` passes TensorFlow's noise on",
        "dpkeras/cluster/_task.py",
        "    _quiet.filter_stderr()  # the server logs",
        "    pass  # the server logs",
        ("tests/test_quiet.py::test_a_served_task_hides_the_dump_tensorflow_logs_for_each_client",),
    ),
    Mutant(
        "eager-init",
        "`import dpkeras` imports TensorFlow (dpkeras --help takes seconds and prints its noise)",
        "dpkeras/__init__.py",
        "__getattr__, __dir__ = exports(__name__, _EXPORTS)",
        "__getattr__, __dir__ = exports(__name__, _EXPORTS)\nimport tensorflow",
        ("tests/test_quiet.py::test_dpkeras_help_and_launch_help_import_no_tensorflow",),
    ),
    Mutant(
        "dump-shown",
        "the lines of the SessionOptions dump after its first are passed on",
        "dpkeras/_quiet.py",
        "self._in_dump = bool(_DUMP.search(text))",
        "self._in_dump = False",
        (
            "tests/test_quiet.py::"
            "test_the_filter_keeps_everything_that_is_not_tensorflow_s_logging",
            "tests/test_quiet.py::"
            "test_a_served_task_hides_the_dump_tensorflow_logs_for_each_client",
        ),
    ),
    Mutant(
        "status-payload-shown",
        "a lost task's warning whose status ends with its payloads passes on its lines after it",
        "dpkeras/_quiet.py",
        """    r"|\\s*\\[\\[.*\\]\\]( \\[[\\w./-]+='.*'\\])*$|.* \\.\\.\\. \\[truncated\\]$"\n""",
        """    r"|\\s*\\[\\[.*\\]\\]$|.* \\.\\.\\. \\[truncated\\]$"\n""",
        (
            "tests/test_quiet.py::"
            "test_a_client_drops_tensorflow_s_warnings_of_a_lost_task_and_keeps_the_rest",
        ),
    ),
    Mutant(
        "status-cut-shown",
        "a lost task's warning whose status holds a remote status cut at 3,072 characters "
        "passes on its lines after the cut",
        "dpkeras/_quiet.py",
        """|.* \\.\\.\\. \\[truncated\\]$"\n""",
        """"\n""",
        (
            "tests/test_quiet.py::"
            "test_a_client_drops_tensorflow_s_warnings_of_a_lost_task_and_keeps_the_rest",
        ),
    ),
    Mutant(
        "elastic-left-out-watched",
        "the health monitor probes a worker fit goes on without, and ends the client (exit 75)",
        "dpkeras/cluster/_health.py",
        "                if name in _left_out:  # training goes on without it (`leave_out`)\n",
        "                if False:\n",
        (
            "tests/test_elastic_workers.py::"
            "test_the_monitor_does_not_end_the_client_for_a_task_left_out",
        ),
    ),
    Mutant(
        "elastic-left-out-named",
        "a worker fit goes on without is named for any later error on the cluster",
        "dpkeras/cluster/_health.py",
        "remote.items() if n not in _left_out}",
        "remote.items()}",
        ("tests/test_elastic_workers.py::test_a_task_left_out_is_not_named_until_taken_back",),
    ),
    Mutant(
        "elastic-server-def-unchanged",
        "a lost worker stays in the client's connection (functions are still sent to it)",
        "dpkeras/cluster/_connect.py",
        "                del job.tasks[task.task]\n",
        "                pass\n",
        (
            "tests/test_elastic_workers.py::"
            "test_the_server_definition_without_a_task_keeps_every_other",
        ),
    ),
    Mutant(
        "elastic-variables-not-checked",
        "the replicas of a task that holds variables' values (a parameter device) are left out",
        "dpkeras/_extended/extended.py",
        "            if ours is not None and any(ours.lives_on(task) for task in tasks):\n",
        "            if False:\n",
        ("tests/test_elastic_workers.py::test_replicas_are_not_left_out_where_a_variable_lives",),
    ),
    Mutant(
        "elastic-off",
        "a lost worker is always waited for ($DPKERAS_ELASTIC_WORKERS read as 0)",
        "dpkeras/_patches/lost_tasks.py",
        ' or not _config.setting("elastic_workers").value:',
        " or True:",
        (
            "tests/test_cluster_training.py::"
            "test_a_worker_lost_mid_fit_is_left_out_and_taken_back_within_float_tolerance[k1]",
        ),
    ),
    Mutant(
        "elastic-never-taken-back",
        "a left-out worker that answers again is never taken back",
        "dpkeras/_patches/lost_tasks.py",
        "            raise _Rejoin(task)\n",
        "            pass\n",
        (
            "tests/test_cluster_training.py::"
            "test_a_worker_lost_mid_fit_is_left_out_and_taken_back_within_float_tolerance[k1]",
        ),
    ),
    Mutant(
        "elastic-same-replicas",
        "the replicas of a lost worker keep running (the next step fails again)",
        "dpkeras/_extended/extended.py",
        "        self._compute_devices = self._input.compute_devices\n",
        "        pass\n",
        (
            "tests/test_cluster_training.py::"
            "test_a_worker_lost_mid_fit_is_left_out_and_taken_back_within_float_tolerance[k1]",
        ),
    ),
    Mutant(
        "left-out-error-shown",
        "a client shows TensorFlow's ERROR of closing its context on a worker fit left out",
        "dpkeras/_quiet.py",
        '    "E": re.compile(r"context',
        '    "X": re.compile(r"context',
        ("tests/test_quiet.py::test_a_client_drops_tensorflow_s_error_for_a_worker_left_out",),
    ),
    Mutant(
        "lost-task-test-function-kept",
        "after a lost ps, the evaluation step that held its resources is kept (validation fails)",
        "dpkeras/_patches/lost_tasks.py",
        "    model.train_function = model.test_function = model.predict_function = None\n",
        "    model.train_function = None\n",
        (
            "tests/test_cluster_training.py::"
            "test_a_task_lost_mid_fit_is_waited_for_and_the_same_fit_goes_on_exactly"
            "[ps-all-on-ps-k1]",
        ),
    ),
    Mutant(
        "lost-task-epochs-twice",
        "an epoch trained again after a lost task is in the History twice",
        "dpkeras/_patches/lost_tasks.py",
        "if later is not None and epoch >= later:",
        "if later is not None and epoch > later:",
        (
            "tests/test_cluster_training.py::"
            "test_a_task_lost_mid_fit_is_waited_for_and_the_same_fit_goes_on_exactly"
            "[ps-epoch-trained-again]",
        ),
    ),
    Mutant(
        "lost-task-log-without-backup",
        "the line logged for a lost task does not name the backup it restores",
        "dpkeras/_patches/lost_tasks.py",
        '"variable is restored from the backup in %s and fit goes on.",',
        '"variable is restored from the backup and fit goes on.%s",',
        (
            "tests/test_cluster_training.py::"
            "test_a_task_lost_mid_fit_is_waited_for_and_the_same_fit_goes_on_exactly"
            "[ps-all-on-ps-k1]",
        ),
    ),
    Mutant(
        "lost-task-waits-forever",
        "the wait for a lost task never runs out",
        "dpkeras/cluster/_health.py",
        "if reason is None or time.monotonic() >= deadline:",
        "if reason is None:",
        (
            "tests/test_cluster_training.py::"
            "test_a_lost_ps_that_does_not_answer_within_the_wait_ends_fit_saying_so",
        ),
    ),
    Mutant(
        "lost-task-wait-ignored",
        "a lost task that never answered is connected to anyway",
        "dpkeras/_patches/lost_tasks.py",
        "        if why is not None:\n",
        "        if why is not None and False:\n",
        (
            "tests/test_cluster_training.py::"
            "test_a_lost_ps_that_does_not_answer_within_the_wait_ends_fit_saying_so",
        ),
    ),
    Mutant(
        "lost-task-reason-dropped",
        "a refusal after a lost task no longer says why the task is unreachable",
        "dpkeras/_patches/lost_tasks.py",
        "error.task, error.address, error.reason, error.tensorflow_error",
        'error.task, error.address, "lost", error.tensorflow_error',
        (
            "tests/test_cluster_training.py::"
            "test_a_task_killed_mid_fit_fails_fast_and_the_run_resumes_exactly[ps-epoch]",
        ),
    ),
    Mutant(
        "lost-task-backup-subclass",
        "a subclass of BackupAndRestore is not found: fit does not go on after a lost task",
        "dpkeras/_patches/lost_tasks.py",
        "if isinstance(callback, keras.callbacks.BackupAndRestore):",
        "if type(callback) is keras.callbacks.BackupAndRestore:",
        (
            "tests/test_cluster_training.py::"
            "test_a_task_lost_mid_fit_is_waited_for_and_the_same_fit_goes_on_exactly"
            "[ps-all-on-ps-k1]",
        ),
    ),
    Mutant(
        "restart-timeout-nan",
        "$DPKERAS_TASK_RESTART_TIMEOUT=nan or inf is taken (an endless wait)",
        "dpkeras/_config.py",
        "not 0 <= value < inf:",
        "value < 0:",
        ("tests/test_config.py::test_a_bad_environment_value_is_named",),
    ),
    Mutant(
        "restart-timeout-whole-seconds",
        "$DPKERAS_TASK_RESTART_TIMEOUT=2.5 is refused (read as a whole number)",
        "dpkeras/_config.py",
        "_seconds_or_off(float(text.strip()), name)",
        "_seconds_or_off(int(text.strip()), name)",
        ("tests/test_config.py::test_argument_then_environment_then_default",),
    ),
    Mutant(
        "backup-last-batch-as-epoch-end",
        "a backup at an epoch's last batch is written there as the epoch's end (a run lost in "
        "that epoch's validation resumes at the next epoch, without the epoch's History entry)",
        "dpkeras/_patches/resume.py",
        "            _DEFERRED.add(callback)\n            return None\n        complete = False\n",
        "            epoch, batch = epoch + 1, 0\n        else:\n            complete = False\n",
        (
            "tests/test_resume_mid_epoch.py::"
            "test_a_run_lost_in_the_validation_after_a_backup_at_the_last_batch_logs_that_epoch",
        ),
    ),
    Mutant(
        "elastic-worker-0-left-out",
        "worker 0, which runs the step loop, is left out when lost (the next step fails)",
        "dpkeras/_patches/lost_tasks.py",
        '    if _loop.loop_device(extended.cluster_spec).startswith(f"{task}/"):\n',
        "    if False:\n",
        (
            "tests/test_elastic_workers.py::"
            "test_worker_0_runs_the_step_loop_and_is_waited_for_not_left_out",
        ),
    ),
    Mutant(
        "reconnect-no-claim",
        "a restarted ps connected again holds no record of its client (a second client could "
        "train there)",
        "dpkeras/cluster/_connect.py",
        "        _tf_internals.reconnect_restarted_tasks()\n"
        "        claim(_connected, _record, only=task)\n",
        "        _tf_internals.reconnect_restarted_tasks()\n",
        (
            "tests/test_cluster_training.py::"
            "test_a_task_lost_mid_fit_is_waited_for_and_the_same_fit_goes_on_exactly"
            "[ps-all-on-ps-k1]",
        ),
    ),
    Mutant(
        "take-back-no-claim",
        "a worker taken back holds no record of its client (a second client could train there)",
        "dpkeras/cluster/_connect.py",
        "        _health.take_back(task)\n        claim(_connected, _record, only=task)\n",
        "        _health.take_back(task)\n",
        (
            "tests/test_cluster_training.py::"
            "test_a_worker_lost_mid_fit_is_left_out_and_taken_back_within_float_tolerance[k1]",
        ),
    ),
    Mutant(
        "take-back-keeps-step-functions",
        "a worker taken back is left idle: the step functions traced on fewer replicas are kept",
        "dpkeras/_patches/lost_tasks.py",
        "    extended.compute_without(_health.left_out())\n    _forget_step_functions(model)\n",
        "    extended.compute_without(_health.left_out())\n",
        (
            "tests/test_cluster_training.py::"
            "test_a_worker_lost_mid_fit_is_left_out_and_taken_back_within_float_tolerance[k1]",
        ),
    ),
    Mutant(
        "wait-off-asks-for-a-backup",
        "with $DPKERAS_TASK_RESTART_TIMEOUT=0 and no backup, the error asks for a backup "
        "(which would not make fit wait)",
        "dpkeras/_patches/lost_tasks.py",
        "            if timeout == 0:\n",
        "            if timeout == 0 and backup is not None:\n",
        (
            "tests/test_cluster_training.py::"
            "test_a_task_lost_under_a_fit_without_a_backup_ends_it_saying_what_to_add",
        ),
    ),
    Mutant(
        "second-loss-ends-fit",
        "a task lost a second time in the same fit ends it instead of being waited for again",
        "dpkeras/_patches/lost_tasks.py",
        '            histories.append(getattr(model, "history", None))\n            lost = error\n',
        "            if lost is not None:\n                raise\n"
        '            histories.append(getattr(model, "history", None))\n            lost = error\n',
        (
            "tests/test_cluster_training.py::"
            "test_a_ps_lost_twice_in_one_fit_is_waited_for_twice_and_the_fit_ends_exactly",
        ),
    ),
    Mutant(
        "take-back-not-reached",
        "a worker taken back is used at once, before worker 0 and the ps tasks reach it again",
        "dpkeras/cluster/_connect.py",
        "        claim(_connected, _record, only=task)\n"
        "    _wait_until_reached(task)\n\n\ndef _wait",
        "        claim(_connected, _record, only=task)\n\n\ndef _wait",
        (
            "tests/test_cluster_training.py::"
            "test_every_task_reaches_a_worker_taken_back_when_take_back_returns",
        ),
    ),
    Mutant(
        "compile-outside",
        "a model of a dpkeras strategy compiled outside its scope is let through, as Keras does",
        "dpkeras/_patches/outside_the_scope.py",
        "    if extended_of(current) is not extended:\n",
        "    if False:\n",
        ("tests/test_errors.py::test_compile_outside_the_model_scope_is_one_clear_error",),
    ),
    Mutant(
        "cluster-never-entered",
        "a model without a strategy trains on the client beside a cluster strategy never entered",
        "dpkeras/_patches/outside_the_scope.py",
        "        if waiting and extended_of(model) is None:\n",
        "        if False:\n",
        (
            "tests/test_cluster_training.py::"
            "test_a_model_trained_beside_a_cluster_strategy_never_entered_is_refused",
        ),
    ),
    Mutant(
        "tf-variable-scope",
        "tf.compat.v1.variable_scope around dpkeras's variables is ignored without a word",
        "dpkeras/_compat_scopes.py",
        "    if not name:\n",
        "    if True:\n",
        (
            "tests/test_tf1_errors.py::"
            "test_tensorflow_s_variable_scope_around_dpkeras_variables_is_refused",
        ),
    ),
    Mutant(
        "tf1-root-reuse-ignored",
        "get_variable at top level creates after get_variable_scope().reuse_variables()",
        "dpkeras/tf1/_get_variable.py",
        "    mode = scope.reuse\n",
        "    mode = scope.reuse if scope.name else False\n",
        ("tests/test_tf1_scopes.py::test_error_reusing_at_top_level_a_name_that_does_not_exist",),
    ),
    Mutant(
        "tf1-root-reuse-not-inherited",
        "a scope entered at top level ignores the root scope's reuse (the tower loop's idiom)",
        "dpkeras/tf1/_scopes.py",
        "            mode = (parent or root_scope(store)).reuse\n",
        "            mode = parent.reuse if parent else False\n",
        (
            "tests/test_tf1_scopes.py::"
            "test_the_tower_loop_as_written_in_tf1_shares_one_set_of_variables",
        ),
    ),
    Mutant(
        "tf1-replica-device-setter-as-spec-policy",
        "replica_device_setter's function is called with a VariableSpec (fails on spec.device)",
        "dpkeras/placement.py",
        "    if _tf_internals.is_replica_device_setter(parameter_device):\n",
        "    if False:\n",
        (
            "tests/test_placement.py::"
            "test_replica_device_setter_is_a_placement_policy_asked_as_tf1_asked_it",
        ),
    ),
    Mutant(
        "tf1-device-function-op-unnamed",
        "a TF1 device function is asked about an op that does not name the variable",
        "dpkeras/placement.py",
        "        self.name = spec.path\n",
        "        self.name = 'Variable'\n",
        (
            "tests/test_placement.py::"
            "test_replica_device_setter_is_a_placement_policy_asked_as_tf1_asked_it",
        ),
    ),
    Mutant(
        "tf1-named-device-ignored",
        "a device named for get_variable (device= or tf.device) is overridden by the policy",
        "dpkeras/_extended/creator.py",
        "        elif _NAMED.device is not None:\n",
        "        elif False:\n",
        (
            "tests/test_tf1_under_a_strategy.py::"
            "test_a_device_named_for_a_variable_is_where_it_lives",
        ),
    ),
    Mutant(
        "tf1-named-device-unchecked",
        "a device named for get_variable that is not the strategy's is taken without a word",
        "dpkeras/tf1/_get_variable.py",
        "    if canonical not in valid:\n",
        "    if canonical is None:\n",
        (
            "tests/test_tf1_under_a_strategy.py::"
            "test_error_a_device_named_that_is_not_the_strategy_s",
        ),
    ),
    Mutant(
        "tf1-tf-get-variable-silent",
        "tf.compat.v1.get_variable under dpkeras makes a new variable per build and trace",
        "dpkeras/_extended/creator.py",
        '        if colocate_with is None and "collections" in kwargs:\n',
        "        if False:\n",
        (
            "tests/test_tf1_errors.py::"
            "test_tensorflow_s_get_variable_under_dpkeras_is_refused_naming_the_replacement",
        ),
    ),
    Mutant(
        "tf1-ema-slots-refused",
        "the averages ExponentialMovingAverage makes beside a variable are refused as get_variable",
        "dpkeras/_extended/creator.py",
        '        if colocate_with is None and "collections" in kwargs:\n',
        '        if "collections" in kwargs:\n',
        (
            "tests/test_tf1_under_a_strategy.py::"
            "test_ema_of_a_get_variable_through_its_value_in_a_tf_function_step",
        ),
    ),
    Mutant(
        "second-client",
        "a client connects to a cluster on which another client trains (no check of the record)",
        "dpkeras/cluster/_connect.py",
        "        reservation = reserve(cluster, record, timeout)\n",
        "        reservation = type('R', (), {'release': lambda self: None})()\n",
        (
            "tests/test_cluster_clients.py::"
            "test_a_second_client_is_refused_naming_the_first_and_env_shows_it_undisturbed",
        ),
    ),
    Mutant(
        "reserve-without-the-task-lock",
        "the compare-and-swap of a task's client record runs outside the mutex every client "
        "shares on the task",
        "dpkeras/cluster/_client_record.py",
        "    return section.execute(swap)\n",
        "    return swap()\n",
        (
            "tests/test_cluster_clients.py::"
            "test_a_swap_waits_for_the_lock_another_session_holds_on_the_task",
        ),
    ),
    Mutant(
        "reserve-writes-whatever-it-read",
        "the swap writes this client's record whatever it found (read, then write: two "
        "clients at once both write, each reading the other's state)",
        "dpkeras/cluster/_client_record.py",
        "tf.cond(tf.equal(current, expected), write,",
        "tf.cond(tf.constant(True), write,",
        (
            "tests/test_cluster_clients.py::"
            "test_of_clients_reserving_at_once_exactly_one_holds_the_cluster",
        ),
    ),
    Mutant(
        "reserve-ignores-a-connecting-client",
        "a record of a client still connecting holds nothing: two clients at once both train",
        "dpkeras/cluster/_client_record.py",
        '        return "is connecting to it" if alive else None\n',
        "        return None\n",
        (
            "tests/test_cluster_clients.py::"
            "test_of_clients_reserving_at_once_exactly_one_holds_the_cluster",
            "tests/test_cluster_clients.py::"
            "test_two_clients_started_at_once_one_trains_and_the_other_is_refused_in_one_line",
        ),
    ),
    Mutant(
        "reserve-kept-after-a-failed-connect",
        "a client whose connecting fails after reserving keeps the tasks reserved",
        "dpkeras/cluster/_connect.py",
        "        except BaseException:\n            reservation.release()\n            raise\n",
        "        except BaseException:\n            raise\n",
        (
            "tests/test_cluster_clients.py::"
            "test_a_client_whose_connecting_failed_after_reserving_leaves_the_cluster_free",
        ),
    ),
    Mutant(
        "tf1-scopes-not-carried-into-replicas",
        "the variable scopes around strategy.run are not in effect in its replica threads (TF1's "
        "tower loop under strategy.run makes a second set of variables, or fails)",
        "dpkeras/tf1/_state.py",
        "register(_capture, _restored)  # carried",
        "(_capture, _restored)  # carried",
        (
            "tests/test_tf1_under_a_strategy.py::"
            "test_scopes_entered_around_strategy_run_are_in_effect_in_every_replica",
            "tests/test_tf1_programs.py::"
            "test_two_towers_give_one_tower_s_losses_on_the_same_global_batches",
        ),
    ),
    Mutant(
        "tf1-store-blocks-not-carried-into-replicas",
        "a `with VariableStore():` block around strategy.run is not in effect in its replicas",
        "dpkeras/tf1/_state.py",
        "        with blocks_opened(blocks):\n            yield\n",
        "        yield\n",
        (
            "tests/test_tf1_under_a_strategy.py::"
            "test_scopes_entered_around_strategy_run_are_in_effect_in_every_replica",
        ),
    ),
    Mutant(
        "tf1-untracked-tf-variable-silent",
        "a plain tf.Variable made by a Keras layer under dpkeras (never trained) passes silently",
        "dpkeras/_extended/creator.py",
        "            if not _keras_internals.making_a_keras_variable():\n",
        "            if False:\n",
        (
            "tests/test_tf1_under_a_strategy.py::"
            "test_a_plain_tf_variable_made_in_a_layer_s_build_is_named_in_one_warning",
        ),
    ),
    Mutant(
        "tf1-untracked-warns-for-keras-variables",
        "every layer weight is taken for a plain tf.Variable (a warning for each Keras weight)",
        "dpkeras/_extended/creator.py",
        "            if not _keras_internals.making_a_keras_variable():\n",
        "            if True:\n",
        (
            "tests/test_tf1_under_a_strategy.py::"
            "test_keras_s_own_variables_and_get_variable_in_build_warn_nothing",
        ),
    ),
    Mutant(
        "device-function-home-on-the-client",
        "on a cluster, a device-function policy (replica_device_setter) keeps reductions on "
        "/cpu:0, which a client that is worker 0 does not have",
        "dpkeras/_extended/devices.py",
        "        home = default_parameters[0]  # for a policy",
        "        home = None  # for a policy",
        (
            "tests/test_docs_examples.py::"
            "test_cluster_block_runs_under_launch[from-a-tf1-program-3-run1]",
        ),
    ),
    Mutant(
        "tf-device-in-a-traced-function-unread",
        "a device named with tf.device around get_variable in a tf.function is not read (TF 2.21's "
        "graph device stack holds _UserDeviceSpec, whose string is raw_string)",
        "dpkeras/_tf_internals.py",
        "        name = spec.raw_string  # a",
        "        name = spec.function  # a",
        (
            "tests/test_tf1_under_a_strategy.py::"
            "test_a_device_named_with_tf_device_in_a_tf_function_is_where_the_variable_lives",
        ),
    ),
    Mutant(
        "reduce-to-localhost-on-a-task-client",
        "strategy.reduce's default destination (/device:CPU:0) is /job:localhost's even where "
        "the client is a task of the cluster (worker 0), which has no such device",
        "dpkeras/_extended/extended.py",
        "        if own is not None and not spec.job:\n",
        "        if False:\n",
        (
            "tests/test_tf1_programs.py::"
            "test_a_custom_loop_s_strategy_reduce_works_where_the_client_is_worker_0",
        ),
    ),
    Mutant(
        "worker-0-split-after-tensorflow-starts",
        "worker 0, the client, splits its CPU after reserving the tasks has started TensorFlow: "
        "it computes on one device whatever --cpus says",
        "dpkeras/cluster/_connect.py",
        "            _split_local_cpu()  # before TensorFlow starts",
        "            pass  # before TensorFlow starts",
        (
            "tests/test_tf1_programs.py::"
            "test_worker_0_as_the_client_computes_on_as_many_devices_as_every_worker",
        ),
    ),
    Mutant(
        "tf1-variable-op-without-outputs",
        "the stand-in op a TF1 device function is asked about has no outputs: a ps_strategy "
        "balancing by bytes (tf_cnn_benchmarks') fails with AttributeError",
        "dpkeras/placement.py",
        "        self.outputs = [_VariableValue(",
        "        self.outputz = [_VariableValue(",
        (
            "tests/test_placement.py::"
            "test_a_ps_strategy_balancing_by_bytes_reads_them_off_the_variable_s_op",
        ),
    ),
    Mutant(
        "record-read-fixed-timeout",
        "the client record's read before connecting allows a fixed 5 s, whatever the connect "
        "timeout (a task slow to answer under load failed the start)",
        "dpkeras/cluster/_client_record.py",
        "        reader = RecordReader(address, task, timeout)\n",
        "        reader = RecordReader(address, task, 5.0)\n",
        (
            "tests/test_cluster_clients.py::"
            "test_a_task_slow_to_answer_its_first_read_is_waited_for_within_the_connect_timeout",
        ),
    ),
    Mutant(
        "connect-timeout-not-to-record",
        "connect reads the client records with the default wait, not its own timeout",
        "dpkeras/cluster/_connect.py",
        "        reservation = reserve(cluster, record, timeout)\n",
        "        reservation = reserve(cluster, record)\n",
        (
            "tests/test_cluster_clients.py::"
            "test_a_task_that_answers_its_probe_but_never_a_read_ends_the_start_in_one_clear_error",
        ),
    ),
    Mutant(
        "record-closed-under-read",
        "a reader closes its session while a read that timed out still uses it",
        "dpkeras/cluster/_client_record.py",
        "            if self._busy:\n                return\n",
        "",
        (
            "tests/test_cluster_clients.py::"
            "test_a_task_that_answers_its_probe_but_never_a_read_ends_the_start_in_one_clear_error",
        ),
    ),
    Mutant(
        "record-reads-overlap",
        "a reader starts a second read while the first one's thread still runs",
        "dpkeras/cluster/_client_record.py",
        "            if self._busy:\n                raise TimeoutError(",
        "            if False:\n                raise TimeoutError(",
        (
            "tests/test_cluster_clients.py::"
            "test_a_task_that_answers_its_probe_but_never_a_read_ends_the_start_in_one_clear_error",
        ),
    ),
    Mutant(
        "record-close-raises",
        "a reader whose task is gone since its read raises from close (TensorFlow's "
        "DeadlineExceededError), hiding what reserve or dpkeras env would report",
        "dpkeras/cluster/_client_record.py",
        "            try:\n                session.close()\n            except tf.errors.OpError:",
        "            session.close()\n            if False:",
        (
            "tests/test_cluster_clients.py::"
            "test_a_reader_whose_task_is_gone_since_its_read_closes_without_raising",
        ),
    ),
    Mutant(
        "record-reader-left-open",
        "reserve does not close its readers: a caller holding its error holds a "
        "session and a connection on the task",
        "dpkeras/cluster/_client_record.py",
        "            finally:\n                reader.close()\n            reservation",
        "            finally:\n                pass\n            reservation",
        (
            "tests/test_cluster_clients.py::"
            "test_a_refused_client_leaves_no_connection_to_the_task_it_read",
        ),
    ),
    Mutant(
        "record-close-does-nothing",
        "a reader's close leaves its session open",
        "dpkeras/cluster/_client_record.py",
        "            if self._busy:\n                return\n        self._close_session()\n",
        "            if self._busy:\n                return\n",
        (
            "tests/test_cluster_clients.py::"
            "test_a_refused_client_leaves_no_connection_to_the_task_it_read",
            "tests/test_cluster_clients.py::"
            "test_a_reader_whose_task_is_gone_since_its_read_closes_without_raising",
        ),
    ),
    Mutant(
        "record-deadline-unconverted",
        "a read ended by the session's own DeadlineExceededError (before the client's wait "
        "ended) ends the start in TensorFlow's error, not the one-line TimeoutError",
        "dpkeras/cluster/_client_record.py",
        "        except (TimeoutError, tf.errors.DeadlineExceededError) as e:\n",
        "        except TimeoutError as e:\n",
        (
            "tests/test_cluster_clients.py::"
            "test_a_read_that_ends_in_the_session_s_own_deadline_is_the_same_one_line_error",
        ),
    ),
    Mutant(
        "record-timeout-lines",
        "the TimeoutError of a read holds TensorFlow's message as it is, on several lines",
        "dpkeras/cluster/_client_record.py",
        '            why = " ".join(str(e).split())',
        "            why = str(e)",
        (
            "tests/test_cluster_clients.py::"
            "test_a_read_that_ends_in_the_session_s_own_deadline_is_the_same_one_line_error",
        ),
    ),
    Mutant(
        "record-read-half-wait",
        "a record read waits for half its timeout (a task answering in 70% of it fails the start)",
        "dpkeras/cluster/_client_record.py",
        "        thread.join(self._timeout)\n",
        "        thread.join(self._timeout / 2)\n",
        (
            "tests/test_cluster_clients.py::"
            "test_a_read_answered_late_within_its_timeout_succeeds_and_exit_waits_for_its_calls",
        ),
    ),
    Mutant(
        "record-exit-three-calls",
        "the exit waits for three timeouts of a read under way, which makes four calls (its "
        "thread closes the session when the reader was closed under it), each allowed the "
        "timeout",
        "dpkeras/cluster/_client_record.py",
        "_CALLS_PER_READ = 4\n",
        "_CALLS_PER_READ = 3\n",
        (
            "tests/test_cluster_clients.py::"
            "test_a_read_answered_late_within_its_timeout_succeeds_and_exit_waits_for_its_calls",
        ),
    ),
    Mutant(
        "record-exit-aborts",
        "a process exits without waiting for a record read that timed out (it aborts)",
        "dpkeras/cluster/_client_record.py",
        "        thread.join(max(0.0, deadline - time.monotonic()))\n",
        "        pass\n",
        (
            "tests/test_cluster_clients.py::"
            "test_a_task_that_answers_its_probe_but_never_a_read_ends_the_start_in_one_clear_error",
        ),
    ),
    Mutant(
        "adagrad-whole-table",
        "an Adagrad of dpkeras updates a table's sparse gradient over the whole table, as Keras",
        "dpkeras/_extended/sparse_rows.py",
        "    if not _exact(optimizer, gradient, variable):\n",
        "    if True:\n",
        (
            "tests/test_sparse_rows.py::test_an_adagrad_of_dpkeras_updates_a_tables_rows_with_kerass_bits_and_no_whole_table_work",
        ),
    ),
    Mutant(
        "adagrad-rows-rsqrt",
        "the rows' divisor reaches the division straight from sqrt (Grappler rewrites it to "
        "rsqrt: other bits)",
        "dpkeras/_extended/sparse_rows.py",
        "    divisor = tf.gather(ops.sqrt(ops.add(rows, optimizer.epsilon)), positions)\n",
        "    divisor = ops.sqrt(ops.add(tf.gather(rows, positions), optimizer.epsilon))\n",
        (
            "tests/test_sparse_rows.py::test_an_adagrad_of_dpkeras_updates_a_tables_rows_with_kerass_bits_and_no_whole_table_work",
        ),
    ),
    Mutant(
        "adagrad-rows-epsilon-dtype",
        "the rows-only update trusts an epsilon that is 0 in the variable's dtype",
        "dpkeras/_extended/sparse_rows.py",
        "    return np.asarray(epsilon, dtype.as_numpy_dtype) > 0 and epsilon >= smallest\n",
        "    return epsilon > 0 and epsilon >= smallest\n",
        (
            "tests/test_sparse_rows.py::test_where_kerass_check_can_find_a_zero_or_a_nan_kerass_own_update_runs",
        ),
    ),
    Mutant(
        "adagrad-rows-negative-start",
        "the rows-only update runs for an accumulator that starts below 0",
        "dpkeras/_extended/sparse_rows.py",
        " or not start >= 0:\n",
        ":\n",
        (
            "tests/test_sparse_rows.py::test_where_kerass_check_can_find_a_zero_or_a_nan_kerass_own_update_runs",
        ),
    ),
    Mutant(
        "adagrad-rows-nan-start",
        "the rows-only update runs for an accumulator that starts at NaN (`start < 0` is False)",
        "dpkeras/_extended/sparse_rows.py",
        " or not start >= 0:\n",
        " or start < 0:\n",
        (
            "tests/test_sparse_rows.py::test_where_kerass_check_can_find_a_zero_or_a_nan_kerass_own_update_runs",
        ),
    ),
    Mutant(
        "adagrad-rows-subnormal-epsilon",
        "the rows-only update runs for a subnormal epsilon, which TensorFlow flushes to 0",
        "dpkeras/_extended/sparse_rows.py",
        " > 0 and epsilon >= smallest\n",
        " > 0\n",
        (
            "tests/test_sparse_rows.py::test_where_kerass_check_can_find_a_zero_or_a_nan_kerass_own_update_runs",
        ),
    ),
    Mutant(
        "adagrad-rows-float16-subnormal",
        "a float16 epsilon that is subnormal (Keras's default 1e-7) falls back to Keras's update",
        "dpkeras/_extended/sparse_rows.py",
        "        0.0\n        if dtype == tf.float16\n",
        "        np.finfo(np.float16).tiny\n        if dtype == tf.float16\n",
        (
            "tests/test_sparse_rows.py::test_an_adagrad_of_dpkeras_updates_a_tables_rows_with_kerass_bits_and_no_whole_table_work",
        ),
    ),
    Mutant(
        "adagrad-rows-read-whole-accumulator",
        "the rows-only update reads the whole accumulator and gathers its rows from that",
        "dpkeras/_extended/sparse_rows.py",
        "rows = accumulator.value.sparse_read(ids)",
        "rows = tf.gather(tf.convert_to_tensor(accumulator.value), ids)",
        (
            "tests/test_sparse_rows.py::test_an_adagrad_of_dpkeras_updates_a_tables_rows_with_kerass_bits_and_no_whole_table_work",
        ),
    ),
    Mutant(
        "adagrad-rows-not-subclasses",
        "the rows-only update for Keras's Adagrad only, not for a subclass of it",
        "dpkeras/_extended/sparse_rows.py",
        "    if not isinstance(gradient, tf.IndexedSlices) or optimizer_apply.attached(optimizer)"
        " is None:\n",
        '    if type(optimizer).__name__ != "Adagrad":\n        return False\n'
        "    if not isinstance(gradient, tf.IndexedSlices) or optimizer_apply.attached(optimizer)"
        " is None:\n",
        (
            "tests/test_sparse_rows.py::test_a_subclass_and_a_gradient_of_another_dtype_update_on_the_rows_with_kerass_bits",
        ),
    ),
    Mutant(
        "adagrad-rows-no-gradient-cast",
        "the rows-only update does not cast a gradient of another dtype to the table's",
        "dpkeras/_extended/sparse_rows.py",
        "    gradient = ops.cast(gradient, variable.dtype)\n",
        "",
        (
            "tests/test_sparse_rows.py::test_a_subclass_and_a_gradient_of_another_dtype_update_on_the_rows_with_kerass_bits",
        ),
    ),
    Mutant(
        "dedup-off-sums-sgd",
        "under Deduplicate.OFF an SGD's repeated ids' gradient rows are summed before they cross",
        "dpkeras/_variables/dedup.py",
        "    if mode is not Deduplicate.ON:\n        return False\n",
        "",
        (
            "tests/test_dedup.py::test_without_deduplication_one_replica_under_sgd_is_one_device_bit_for_bit",
        ),
    ),
    Mutant(
        "shares-rows-unknown-auto",
        "a host's own pipeline (AUTO) batches its share with unknown rows, even when known",
        "dpkeras/_input/sharding.py",
        "    batches = mine.batch(hi - lo, drop_remainder=even)\n",
        "    batches = mine.batch(hi - lo)\n",
        (
            "tests/test_input_sharding.py::test_each_share_has_known_rows_where_every_share_of_every_batch_is_alike",
        ),
    ),
    Mutant(
        "endless-rows-unknown",
        "an endless dataset batched without drop_remainder and read whole keeps unknown rows",
        "dpkeras/_input/sharding.py",
        "    return size if endless else None\n",
        "    return None\n",
        (
            "tests/test_input_sharding.py::test_rows_of_every_batch_known_from_the_spec_or_an_endless_batchs_input",
            "tests/test_input_sharding.py::test_data_slices_of_an_endless_dataset_have_known_rows",
        ),
    ),
    Mutant(
        "endless-rows-past-any-stage",
        "rows_of_every_batch walks past any stage after the batch but a map (rebatch, flat_map)",
        "dpkeras/_input/sharding.py",
        '    while _tf_internals.dataset_kind(node) in ("options", "prefetch"):',
        '    while _tf_internals.dataset_kind(node) not in ("batch", "map")'
        " and _tf_internals.dataset_input(node) is not None:",
        (
            "tests/test_input_sharding.py::test_rows_of_every_batch_known_from_the_spec_or_an_endless_batchs_input",
        ),
    ),
    Mutant(
        "endless-rows-trust-cardinality",
        "rows_of_every_batch takes TensorFlow's INFINITE_CARDINALITY as endless (it is not, for "
        "choose_from_datasets by a finite selector)",
        "dpkeras/_input/sharding.py",
        "    endless = _surely_endless(_tf_internals.dataset_input(node))\n",
        "    endless = tf.get_static_value(_tf_internals.dataset_input(node).cardinality())"
        " == -1\n",
        (
            "tests/test_input_sharding.py::test_rows_of_every_batch_unknown_for_an_endless_input_that_ends",
        ),
    ),
    Mutant(
        "early-cut-trusts-cardinality",
        "AUTO's early cut takes TensorFlow's INFINITE_CARDINALITY as endless",
        "dpkeras/_input/sharding.py",
        "(elements != tf.data.INFINITE_CARDINALITY or not _surely_endless(node))",
        "(elements != tf.data.INFINITE_CARDINALITY)",
        (
            "tests/test_input_sharding.py::test_rows_of_every_batch_unknown_for_an_endless_input_that_ends",
        ),
    ),
    Mutant(
        "endless-past-any-stage",
        "an endless input is looked for past any stage, not only maps, shuffles, prefetches",
        "dpkeras/_input/sharding.py",
        '    while _tf_internals.dataset_kind(node) in ("map", "shuffle", "prefetch", "options"):',
        '    while _tf_internals.dataset_kind(node) != "repeat"'
        " and _tf_internals.dataset_input(node):",
        (
            "tests/test_input_sharding.py::test_rows_of_every_batch_known_from_the_spec_or_an_endless_batchs_input",
        ),
    ),
    Mutant(
        "shares-rows-unknown",
        "no host's share is given known rows (DATA, and a host of several replicas)",
        "dpkeras/_input/sharding.py",
        "    if rows is None or rows % num_replicas:\n        return slices\n",
        "    return slices\n",
        (
            "tests/test_input_sharding.py::test_each_share_has_known_rows_where_every_share_of_every_batch_is_alike",
            "tests/test_input_sharding.py::test_data_keeps_known_rows_where_every_share_is_alike",
        ),
    ),
    Mutant(
        "shares-rows-known-when-uneven",
        "shares are given known rows even when the replicas' shares differ (100 over 3)",
        "dpkeras/_input/sharding.py",
        "    if rows is None or rows % num_replicas:\n",
        "    if rows is None:\n",
        (
            "tests/test_input_sharding.py::test_each_share_has_known_rows_where_every_share_of_every_batch_is_alike",
            "tests/test_input_sharding.py::test_data_keeps_known_rows_where_every_share_is_alike",
        ),
    ),
    Mutant(
        "step-loop-at-one-step",
        "at steps_per_execution=1 the workers' own reading runs its one step in a while loop",
        "dpkeras/_patches/step_loop.py",
        "        if isinstance(steps, int) and steps == 1:\n",
        "        if False:\n",
        ("tests/test_cluster_loop.py::test_one_step_per_execution_runs_no_loop_on_any_task",),
    ),
    Mutant(
        "adagrad-rows-bfloat16-never",
        "a bfloat16 table never takes the rows-only update",
        "dpkeras/_extended/sparse_rows.py",
        "    if not dtype.is_floating:\n",
        "    if not dtype.is_floating or dtype == tf.bfloat16:\n",
        (
            "tests/test_sparse_rows.py::test_an_adagrad_of_dpkeras_updates_a_tables_rows_with_kerass_bits_and_no_whole_table_work",
        ),
    ),
    Mutant(
        "adagrad-rows-float64-by-float32",
        "a float64 epsilon judged by float32's smallest normal number",
        "dpkeras/_extended/sparse_rows.py",
        "np.float64 if dtype == tf.float64 else np.float32",
        "np.float32",
        (
            "tests/test_sparse_rows.py::test_an_adagrad_of_dpkeras_updates_a_tables_rows_with_kerass_bits_and_no_whole_table_work",
        ),
    ),
    Mutant(
        "adagrad-rows-smallest-excluded",
        "an epsilon equal to the smallest normal number takes Keras's update",
        "dpkeras/_extended/sparse_rows.py",
        "epsilon >= smallest",
        "epsilon > smallest",
        (
            "tests/test_sparse_rows.py::test_an_adagrad_of_dpkeras_updates_a_tables_rows_with_kerass_bits_and_no_whole_table_work",
        ),
    ),
    Mutant(
        "shares-one-tuple-unwrapped",
        "a host of several replicas unwraps a dataset's 1-tuples, a host of one does not",
        "dpkeras/_input/sharding.py",
        "        if not isinstance(slices.element_spec, tuple):\n",
        "        if len(element) == 1:\n",
        (
            "tests/test_input_sharding.py::test_known_rows_keep_the_elements_structure_on_hosts_of_one_and_of_two_replicas",
        ),
    ),
    Mutant(
        "shares-rows-from-a-scalar",
        "the rows of a batch read from its first component even when that is a scalar",
        "dpkeras/_input/batch_rows.py",
        "shape is not None and shape.rank != 0:",
        "shape is not None:",
        (
            "tests/test_input_sharding.py::test_known_rows_are_read_from_the_first_component_with_rows_past_a_scalar",
        ),
    ),
    Mutant(
        "lost-task-unavailable-not-retried",
        "an UnavailableError just after a recovery ends the fit instead of being tried again",
        "dpkeras/_patches/lost_tasks.py",
        "            if lost is None or time.monotonic() >= deadline:\n",
        "            if True:\n",
        (
            "tests/test_lost_tasks.py::test_a_connection_not_back_yet_after_a_recovery_is_tried_again_until_the_deadline",
        ),
    ),
    Mutant(
        "lost-task-unavailable-retried-forever",
        "an UnavailableError after a recovery is tried again past the loss's deadline",
        "dpkeras/_patches/lost_tasks.py",
        "            if lost is None or time.monotonic() >= deadline:\n",
        "            if lost is None:\n",
        (
            "tests/test_lost_tasks.py::test_a_connection_not_back_yet_after_a_recovery_is_tried_again_until_the_deadline",
        ),
    ),
    Mutant(
        "lost-task-loss-forgotten",
        "a lost task's recovery is not remembered, so the UnavailableError after it is raised",
        "dpkeras/_patches/lost_tasks.py",
        "            lost = error\n",
        "",
        (
            "tests/test_lost_tasks.py::test_a_connection_not_back_yet_after_a_recovery_is_tried_again_until_the_deadline",
        ),
    ),
    Mutant(
        "lost-task-part-remade-twice",
        "a variable listed twice has its parts made again twice",
        "dpkeras/_patches/lost_tasks.py",
        "            if id(part) not in seen:\n",
        "            if True:\n",
        ("tests/test_lost_tasks.py::test_a_variable_listed_twice_is_made_again_once",),
    ),
    Mutant(
        "record-close-swallows-deadline-only",
        "a reader's close lets any error of the task but DeadlineExceededError through",
        "dpkeras/cluster/_client_record.py",
        "            except tf.errors.OpError:  # the task is gone",
        "            except tf.errors.DeadlineExceededError:  # the task is gone",
        (
            "tests/test_cluster_clients.py::"
            "test_a_reader_whose_session_close_is_refused_closes_without_raising",
        ),
    ),
    Mutant(
        "adagrad-rows-every-optimizer",
        "every Adagrad, not only dpkeras's, updates on the rows only",
        "dpkeras/_extended/sparse_rows.py",
        "    if not isinstance(gradient, tf.IndexedSlices) or optimizer_apply.attached(optimizer)"
        " is None:\n",
        "    if not isinstance(gradient, tf.IndexedSlices):\n",
        (
            "tests/test_sparse_rows.py::test_an_adagrad_of_dpkeras_updates_a_tables_rows_with_kerass_bits_and_no_whole_table_work",
        ),
    ),
    Mutant(
        "env-client",
        "dpkeras env --cluster shows a task's devices but not the client training on it",
        "dpkeras/_cli/env.py",
        '        client = f"training: {_client_record.describe(record)}"\n',
        '        client = "training"\n',
        (
            "tests/test_cluster_clients.py::"
            "test_a_second_client_is_refused_naming_the_first_and_env_shows_it_undisturbed",
        ),
    ),
    Mutant(
        "task-exit-reason",
        "a task does not read that its client finished: TensorFlow's Abort ends it, unexplained",
        "dpkeras/cluster/_task.py",
        "        if _client_finished(reader, client_name):\n",
        "        if False:\n",
        (
            "tests/test_launch.py::"
            "test_one_program_in_every_task_trains_and_every_task_ends_with_status_0[chief]",
        ),
    ),
    Mutant(
        "client-lines",
        "the client writes no record and no line on the tasks at connecting",
        "dpkeras/cluster/_client_record.py",
        "_write(task, record, f\"client {record['client']} {where} connected\")",
        "tf.constant(0)",
        (
            "tests/test_cluster_clients.py::"
            "test_a_second_client_is_refused_naming_the_first_and_env_shows_it_undisturbed",
        ),
    ),
    Mutant(
        "cluster-epoch-iterators",
        "on a cluster of one-CPU workers, each epoch's iterator is a MultiDeviceIterator per "
        "worker again (six functions traced per worker per iterator, on the client)",
        "dpkeras/_input/plan.py",
        "        if not self.feeds_only_its_own_cpu():\n            return options\n",
        "        if True:\n            return options\n",
        (
            "tests/test_cluster_costs.py::"
            "test_functions_made_per_epoch_do_not_grow_with_the_workers",
        ),
    ),
    Mutant(
        "all-reduce-mean",
        "replicated variables' gradients averaged over the compute devices instead of summed",
        "dpkeras/_extended/all_reduce.py",
        'final_op="Id"',
        'final_op="Div"',
        ("tests/test_exact_matrix.py::test_dpkeras_is_exact[sample_weight]",),
    ),
    Mutant(
        "all-reduce-eager-own",
        "run eagerly, each device keeps its first replica's gradient instead of the sum",
        "dpkeras/_extended/all_reduce.py",
        "sums.append(tf.add_n(parts))",
        "sums.append(tf.add_n(parts[:1]))",
        ("tests/test_hybrid.py::test_eager_steps_all_reduce_too",),
    ),
    Mutant(
        "pass-order",
        "the optimizer's pass 0, which writes the parameter devices, runs first: later passes "
        "read what it wrote",
        "dpkeras/_extended/optimizer_apply.py",
        "for j in reversed(range(len(devices))):",
        "for j in range(len(devices)):",
        (
            "tests/test_hybrid.py::"
            "test_optimizer_state_on_the_parameter_device_beside_replicated_weights",
        ),
    ),
    Mutant(
        "ps-writes-every-pass",
        "a variable on a parameter device is written in every optimizer pass, not once",
        "dpkeras/_variables/pieces.py",
        "    return bool(copy_index(extended))\n",
        "    return False\n",
        (
            "tests/test_hybrid.py::"
            "test_optimizer_state_on_the_parameter_device_beside_replicated_weights",
        ),
    ),
    Mutant(
        "none-writes-own",
        "each replica writes its copy of an aggregation=NONE variable with its own value "
        "(BatchNormalization's moving statistics): the copies drift apart",
        "dpkeras/_variables/replicated.py",
        "        _, args0, kwargs0 = writes[count]\n",
        "        _, args0, kwargs0 = writes[count]\n        args0, kwargs0 = args, kwargs\n",
        (
            "tests/test_hybrid.py::"
            "test_batchnorm_and_dropout_train_as_on_the_parameter_device[batchnorm]",
        ),
    ),
    Mutant(
        "tables-by-name",
        "hybrid() no longer recognises a table by its name: keras-rs's tables are replicated",
        "dpkeras/placement.py",
        'or (kind in (VariableKind.WEIGHT, VariableKind.OTHER) and path.endswith("/embeddings"))',
        "or False",
        (
            "tests/test_keras_rs.py::"
            "test_keras_rs_models_train_to_one_device_weights_under_sgd"
            "[2 replicas, hybrid, 3 shards on 2 devices-dlrm]",
        ),
    ),
    Mutant(
        "collective-keys-restart",
        "collective group keys count from 1 in every client process, as the first client's",
        "dpkeras/_extended/all_reduce.py",
        "zlib.crc32(seed) % (2**31 - 1) + 1",
        "len(_group_keys) + 1",
        (
            "tests/test_hybrid_cluster.py::"
            "test_hybrid_on_a_cluster_trains_to_one_process_weights_history_and_evaluate",
            "tests/test_hybrid_cluster.py::"
            "test_a_second_hybrid_client_of_another_model_trains_on_the_same_servers",
        ),
    ),
    Mutant(
        "pass-device",
        "an op of the optimizer's pass runs on the pass's compute device whatever its inputs: "
        "a table's clipped gradient crosses to a worker and back",
        "dpkeras/_extended/optimizer_apply.py",
        "        return best\n",
        "        return device\n",
        (
            "tests/test_hybrid_cluster.py::"
            "test_a_ps_carries_rows_only_and_the_client_nothing_per_step",
        ),
    ),
    Mutant(
        "iterators-at-iter",
        "an epoch's iterator makes every worker's iterator when Keras makes it, as TensorFlow "
        "does: the iterator Keras throws away at each epoch's end costs two remote ops a worker",
        "dpkeras/_input/at_first_use.py",
        "        if self._dpkeras_shared:\n            return None\n",
        "        if True:\n            return None\n",
        (
            "tests/test_cluster_costs.py::"
            "test_each_epoch_makes_one_iterator_per_worker_for_training_and_one_for_validation",
            "tests/test_iterators_at_first_use.py::"
            "test_nothing_is_made_before_the_first_read_and_the_elements_are_tensorflows",
        ),
    ),
    Mutant(
        "reshuffle-deferred",
        "a dataset that reshuffles each iteration also makes its iterators at first use: the "
        "iterator Keras throws away no longer draws its seeds, and each later epoch's order "
        "differs from one device's",
        "dpkeras/_input/at_first_use.py",
        "            self._dpkeras_shared = any(\n"
        "                _tf_internals.state_shared_by_iterators(p) for p in pipelines\n"
        "            )\n",
        "            self._dpkeras_shared = False\n",
        (
            "tests/test_iterators_at_first_use.py::"
            "test_a_reshuffling_pipeline_keeps_each_epochs_order",
        ),
    ),
    Mutant(
        "input-filter-per-element",
        "each worker picks its rows of a dense source with a predicate per element again: a "
        "function call on every worker for every element of the dataset",
        "dpkeras/_input/sharding.py",
        "    if _batchable(cut.source.element_spec):\n",
        "    if False:\n",
        (
            "tests/test_input_sharding.py::"
            "test_a_dense_source_is_cut_per_global_batch_not_per_element",
        ),
    ),
    Mutant(
        "report-first-copy",
        "placement_report's totals count a replicated variable on its first copy's device only",
        "dpkeras/_strategy/report.py",
        "            for device in row.copies or (row.device,):\n",
        "            for device in row.copies[:1] or (row.device,):\n",
        (
            "tests/test_hybrid.py::"
            "test_hybrid_places_tables_on_the_parameter_device_and_replicates_the_rest",
        ),
    ),
    Mutant(
        "xla-warning-once",
        "the runs-without-XLA warning is given once per process: a second model is not told",
        "dpkeras/_patches/xla.py",
        "    if model not in _warned:\n",
        "    if not _warned:\n",
        ("tests/test_hybrid.py::test_jit_compile_runs_without_xla_and_says_so_once",),
    ),
    Mutant(
        "hybrid-bind-tables",
        "hybrid(tables=...) bound to the strategy's parameter devices loses its tables=",
        "dpkeras/placement.py",
        "return _Hybrid(list(device_list), None if self._tables is None else self._tables.pattern)",
        "return _Hybrid(list(device_list), None)",
        (
            "tests/test_hybrid.py::"
            "test_tables_given_to_an_unbound_hybrid_stay_on_the_parameter_device",
        ),
    ),
    Mutant(
        "hybrid-equal-tables",
        "two hybrid() policies with different tables= are equal: get_strategy gives one strategy",
        "dpkeras/placement.py",
        "return (self.devices, None if self._tables is None else self._tables.pattern)",
        "return (self.devices, None)",
        (
            "tests/test_hybrid.py::"
            "test_tables_given_to_an_unbound_hybrid_stay_on_the_parameter_device",
        ),
    ),
    Mutant(
        "table-subclass",
        "a subclass of a table layer (class MyTable(DynamicEmbedding)) is not a table",
        "dpkeras/placement.py",
        'any(c.__name__.endswith("Embedding") for c in type(layer).__mro__)',
        'type(layer).__name__.endswith("Embedding")',
        ("tests/test_hybrid.py::test_a_subclass_of_a_table_layer_is_a_table",),
    ),
    Mutant(
        "replicated-write-first",
        "a SUM or MEAN write in a replica to a replicated variable takes replica 0's value",
        "dpkeras/_variables/replicated.py",
        "aggregate(self.aggregation, value, self._copies[0].device)",
        'aggregate("ONLY_FIRST_REPLICA", value, self._copies[0].device)',
        ("tests/test_hybrid.py::test_sum_and_mean_writes_in_a_replica_are_reduced",),
    ),
    Mutant(
        "ps-write-first",
        "a SUM or MEAN write in a replica to a variable on a parameter device takes replica 0's",
        "dpkeras/_variables/writes.py",
        "aggregate(self.aggregation, per_replica_value, self.device)",
        'aggregate("ONLY_FIRST_REPLICA", per_replica_value, self.device)',
        ("tests/test_hybrid.py::test_sum_and_mean_writes_in_a_replica_are_reduced",),
    ),
    Mutant(
        "all-reduce-device-0-sum",
        "every compute device uses device 0's result of the all-reduce (sent to it each step)",
        "dpkeras/_extended/all_reduce.py",
        "out[i] = [per_device[r][k] for r in range(n)]",
        "out[i] = [per_device[0][k] for r in range(n)]",
        (
            "tests/test_hybrid.py::"
            "test_gradients_are_all_reduced_among_the_compute_devices_not_through_the_parameter_de"
            "vice",
            "tests/test_hybrid.py::test_each_device_sums_on_itself_and_keeps_its_sum[traced]",
        ),
    ),
    Mutant(
        "all-reduce-eager-device-0-sum",
        "run eagerly, every compute device uses device 0's sum",
        "dpkeras/_extended/all_reduce.py",
        "sums.append(tf.add_n(parts))",
        "sums.append(sums[0] if sums else tf.add_n(parts))",
        ("tests/test_hybrid.py::test_each_device_sums_on_itself_and_keeps_its_sum[eager]",),
    ),
    Mutant(
        "host-split-last-as-full",
        "a host feeding several replicas cuts the last, partial, global batch as if it were full: "
        "its replicas' rows are wrong (2, 0 for 1, 1), their concatenation still right",
        "dpkeras/_input/sharding.py",
        "rows = b if full is None else tf.where(index < full, b, last)",
        "rows = b",
        (
            "tests/test_input_sharding.py::"
            "test_auto_cuts_before_the_maps_and_the_slices_make_the_global_batches",
        ),
    ),
    Mutant(
        "whole-batch-last-replicas",
        "the whole-batch cut of a batch of known rows gives the extra rows to the last replicas "
        "(3, 4 for 7 rows over 2)",
        "dpkeras/_input/shares.py",
        "bounds = [replica_start(r, total, n) for r in range(n + 1)]",
        "bounds = [total - replica_start(n - r, total, n) for r in range(n + 1)]",
        (
            "tests/test_whole_batches.py::"
            "test_the_first_replicas_take_the_extra_rows_of_an_uneven_batch",
        ),
    ),
    Mutant(
        "whole-batch-last-replicas-in-graph",
        "the same break for a batch whose rows are known only when it is read (the epoch loop)",
        "dpkeras/_input/shares.py",
        "bounds = [replica_start_in_graph(r, total, n) for r in range(n + 1)]",
        "bounds = [total - replica_start_in_graph(n - r, total, n) for r in range(n + 1)]",
        (
            "tests/test_whole_batches.py::"
            "test_the_first_replicas_take_the_extra_rows_of_an_uneven_batch",
        ),
    ),
    Mutant(
        "compile-in-another-dpkeras",
        "a model of one dpkeras strategy compiles in another dpkeras strategy's scope",
        "dpkeras/_patches/outside_the_scope.py",
        "    if extended_of(current) is not extended:\n",
        "    if extended_of(current) is None:\n",
        (
            "tests/test_errors.py::"
            "test_compile_outside_the_model_scope_is_one_clear_error[another dpkeras-sgd]",
        ),
    ),
    Mutant(
        "launch-takes-program-verbose",
        "dpkeras launch takes --verbose from the program's arguments after --",
        "dpkeras/_cli/__init__.py",
        'own = argv[: argv.index("--")] if "--" in argv else argv',
        "own = argv",
        (
            "tests/test_launch.py::"
            "test_flags_after_the_double_dash_are_the_program_s_verbose_included",
        ),
    ),
    Mutant(
        "record-unprobed-client",
        "a training client whose address cannot be probed from here is taken for dead: a second "
        "client trains beside it",
        "dpkeras/cluster/_client_record.py",
        "    alive = client_answers(record)\n    if alive is False:\n",
        "    alive = client_answers(record)\n    if not alive:\n",
        (
            "tests/test_cluster_clients.py::"
            "test_a_training_client_that_cannot_be_probed_from_here_refuses_a_second_one",
        ),
    ),
    Mutant(
        "record-dead-client-blocks",
        "the record of a client that died refuses every later client",
        "dpkeras/cluster/_client_record.py",
        "    alive = client_answers(record)\n    if alive is False:\n",
        "    alive = client_answers(record)\n    if False:\n",
        ("tests/test_cluster_clients.py::test_a_dead_client_s_record_does_not_block_a_new_one",),
    ),
    Mutant(
        "task-ends-for-any-client",
        "a task ends with status 0 when the record says any client finished, not its own",
        "dpkeras/cluster/_task.py",
        'record["client"] == client_name and record["state"] == FINISHED',
        'record["state"] == FINISHED',
        (
            "tests/test_cluster_clients.py::"
            "test_a_task_ends_for_its_own_client_s_finished_record_only",
        ),
    ),
    Mutant(
        "fatal-hidden",
        "the quiet filter drops FATAL records with INFO and WARNING",
        "dpkeras/_quiet.py",
        'return record.group(1) in "IW" or',
        'return record.group(1) in "IWF" or',
        ("tests/test_quiet.py::test_a_fatal_record_is_never_hidden_not_even_in_a_dump",),
    ),
    Mutant(
        "fatal-in-dump",
        "a record written while the filter drops a dump is dropped with the dump",
        "dpkeras/_quiet.py",
        "        if _RECORD.match(text):  # a dump or a status holds no record",
        "        if False:  # a dump or a status holds no record",
        ("tests/test_quiet.py::test_a_fatal_record_is_never_hidden_not_even_in_a_dump",),
    ),
    Mutant(
        "filter-in-process",
        "the quiet filter runs in the process it filters (as before): a process that crashes "
        "dies before its FATAL record is passed on",
        "dpkeras/_quiet.py",
        "        self._pump = subprocess.Popen(\n"
        '            [sys.executable, "-c", _PUMP, root, str(read), str(self._saved)],\n'
        "            pass_fds=(read, self._saved),\n"
        "            stdin=subprocess.DEVNULL,\n"
        "            stdout=subprocess.DEVNULL,\n"
        "        )\n"
        "        os.close(read)\n",
        "        import threading\n\n"
        "        self._pump = threading.Thread(\n"
        "            target=pump, args=(read, self._saved), daemon=True\n"
        "        )\n"
        "        self._pump.start()\n"
        "        self._pump.wait = self._pump.join\n",
        ("tests/test_quiet.py::test_a_process_that_crashes_shows_its_fatal_record",),
    ),
    Mutant(
        "uninstall-inherited",
        "what the owner held is read after the wrapper is set, so uninstall() sets the inherited "
        "function on the class (keras.optimizers.Optimizer keeps an apply of its own)",
        "dpkeras/_patches/entries.py",
        "        own = vars(owner).get(self.name, _INHERITED)\n"
        "        setattr(owner, self.name, _wrap(self, original))\n",
        "        setattr(owner, self.name, _wrap(self, original))\n"
        "        own = original if self.name in vars(owner) else _INHERITED\n",
        (
            "tests/test_keras_patches.py::"
            "test_after_uninstall_every_patched_owner_holds_what_it_held_before_dpkeras",
        ),
    ),
    Mutant(
        "register-on-first-use",
        "import dpkeras registers nothing with Keras: dpkeras>DynamicEmbedding is registered "
        "only when dpkeras.layers is first used, and a file holding it no longer loads",
        "dpkeras/__init__.py",
        "_serializable.register()\n",
        "",
        (
            "tests/test_serializable.py::"
            "test_each_registered_class_loads_in_a_process_that_imports_only_dpkeras",
            "tests/test_serializable.py::"
            "test_import_dpkeras_imports_no_keras_and_registers_when_keras_is_imported",
        ),
    ),
    Mutant(
        "register-no-hook",
        "import dpkeras registers only with a Keras imported before it: `import dpkeras; "
        "import keras` cannot load a file holding a DynamicEmbedding",
        "dpkeras/_serializable.py",
        "        sys.meta_path.insert(0, _WhenKerasIsImported())\n",
        "        pass\n",
        (
            "tests/test_serializable.py::"
            "test_each_registered_class_loads_in_a_process_that_imports_only_dpkeras"
            "[dpkeras-first]",
        ),
    ),
    Mutant(
        "register-keras-first",
        "import dpkeras after Keras registers nothing (the hook waits for an import that has "
        "happened)",
        "dpkeras/_serializable.py",
        '    if keras is not None and hasattr(keras, "saving"):',
        "    if False:",
        (
            "tests/test_serializable.py::"
            "test_each_registered_class_loads_in_a_process_that_imports_only_dpkeras"
            "[keras-first]",
        ),
    ),
    Mutant(
        "register-imports-keras",
        "import dpkeras imports Keras, and with it TensorFlow, to register its classes",
        "dpkeras/_serializable.py",
        '    keras = sys.modules.get("keras")\n',
        '    keras = importlib.import_module("keras")\n',
        (
            "tests/test_serializable.py::"
            "test_import_dpkeras_imports_no_keras_and_registers_when_keras_is_imported",
        ),
    ),
    Mutant(
        "unseeded-copies",
        "each input host's copy of a pipeline with unseeded random ops draws its own seeds (the "
        "cause of issue 40's lost errors: workers shuffle Keras's arrays differently)",
        "dpkeras/_input/plan.py",
        "copy = source.copy(hosts[i], graph_def)",
        "copy = source.copy(hosts[i])",
        (
            "tests/test_cluster_step_errors.py::"
            "test_each_row_is_trained_once_an_epoch_in_a_new_order_each_epoch",
            "tests/test_cluster_step_errors.py::"
            "test_a_failing_step_raises_each_time_and_changes_no_weight",
        ),
    ),
    Mutant(
        "unseeded-source-cut",
        "AUTO cuts a pipeline whose source shuffles without a seed: each host maps the elements "
        "of its own order",
        "dpkeras/_input/sharding.py",
        "if cut is None or seeds.Pipeline.of(cut.source).ops:",
        "if cut is None:",
        (
            "tests/test_cluster_step_errors.py::"
            "test_each_row_is_trained_once_an_epoch_in_a_new_order_each_epoch",
        ),
    ),
    Mutant(
        "unseeded-once-per-fit",
        "an unseeded pipeline's copies share seeds drawn once per fit: Keras's arrays in one "
        "order every epoch",
        "dpkeras/_input/plan.py",
        "remake=each_epoch if unseeded else None",
        "remake=None",
        (
            "tests/test_cluster_step_errors.py::"
            "test_each_row_is_trained_once_an_epoch_in_a_new_order_each_epoch",
        ),
    ),
    Mutant(
        "unseeded-same-every-epoch",
        "an unseeded pipeline gets the same seeds every epoch: Keras's arrays in one order",
        "dpkeras/_input/seeds.py",
        "return random.SystemRandom().randrange(1, 2**62)",
        "return 12345",
        (
            "tests/test_cluster_step_errors.py::"
            "test_each_row_is_trained_once_an_epoch_in_a_new_order_each_epoch",
        ),
    ),
    Mutant(
        "task-error-chained",
        "a lost task's TaskFailedError is chained to TensorFlow's error again: ~30 lines of gRPC "
        "details and 'The above exception was the direct cause' before the line naming the task",
        "dpkeras/cluster/_health.py",
        "tensorflow_error=error) from None",
        "tensorflow_error=error) from error",
        (
            "tests/test_cluster.py::test_name_failures_names_the_refusing_task",
            "tests/test_cluster_training.py::"
            "test_a_task_killed_mid_fit_fails_fast_and_the_run_resumes_exactly[worker-epoch]",
        ),
    ),
    Mutant(
        "task-warnings-shown",
        "a client's standard error is not filtered: TensorFlow's 'Unable to destroy remote tensor "
        "handles' warnings of a step failing for a killed task are printed before the error",
        "dpkeras/cluster/_connect.py",
        "        _quiet.filter_client_stderr()\n",
        "        pass\n",
        (
            "tests/test_cluster_training.py::"
            "test_a_task_killed_mid_fit_fails_fast_and_the_run_resumes_exactly[worker-epoch]",
        ),
    ),
    Mutant(
        "status-lines-kept",
        "a dropped TensorFlow record's error-status lines (root errors, gRPC details) are kept: "
        "the lines after a hidden warning still show",
        "dpkeras/_quiet.py",
        "            self._in_status = not (self._in_dump or self._in_proto)\n",
        "            self._in_status = False\n",
        (
            "tests/test_quiet.py::"
            "test_a_client_drops_tensorflow_s_warnings_of_a_lost_task_and_keeps_the_rest",
            "tests/test_quiet.py::"
            "test_a_client_s_filter_is_a_process_that_passes_on_its_last_lines",
        ),
    ),
    Mutant(
        "partial-lines-held",
        "a filtered standard error holds every line until it ends: a progress bar redrawn with "
        "'\\r' on stderr shows nothing until its last redraw",
        "dpkeras/_quiet.py",
        "        if pending and not _may_be_noise(pending, lines):\n",
        "        if False:\n",
        ("tests/test_quiet.py::test_a_client_s_filter_passes_a_line_s_start_on_at_once",),
    ),
    Mutant(
        "synchronized-batchnorm",
        "ReplicaContext.all_reduce (what BatchNormalization(synchronized=True) sums its "
        "statistics with) gives replica 0's value: every replica normalizes with replica 0's "
        "statistics (MEAN would not show: Keras divides the sum by the count, both averaged)",
        "dpkeras/_extended/cross_replica.py",
        "reduce_op, value, self._reduction_device(destinations), from_every_replica=False",
        '"ONLY_FIRST_REPLICA", value, self._reduction_device(destinations), '
        "from_every_replica=False",
        (
            "tests/test_exact_matrix.py::test_dpkeras_is_exact[synchronized_batchnorm]",
            "tests/test_cluster_training.py::"
            "test_rows_of_the_exact_table_on_a_cluster[synchronized_batchnorm-all-on-ps]",
            "tests/test_cluster_training.py::"
            "test_rows_of_the_exact_table_on_a_cluster[synchronized_batchnorm-hybrid]",
        ),
    ),
    Mutant(
        "task-without-device",
        "a task named without a device (TF1's '/job:ps/task:0') is refused again",
        "dpkeras/_device_names.py",
        'spec = spec.replace(device_type="CPU", device_index=0)  # a task: its CPU:0',
        "pass  # a task: its CPU:0",
        (
            "tests/test_placement.py::"
            "test_a_task_named_without_a_device_is_its_cpu_0_wherever_a_device_is_taken",
            "tests/test_cluster_training.py::"
            "test_ps_tasks_named_as_tf1_names_them_and_hybrid_by_name",
        ),
    ),
    Mutant(
        "by-path-replicated",
        "by_path refuses placement.REPLICATED as a rule or default",
        "dpkeras/placement.py",
        "    if value is REPLICATED:\n        return _Replicate()\n",
        "",
        (
            "tests/test_placement.py::test_by_path_answers_replicated_for_a_rule_or_the_default",
            "tests/test_cluster_training.py::"
            "test_ps_tasks_named_as_tf1_names_them_and_hybrid_by_name",
        ),
    ),
    Mutant(
        "by-path-replicated-metrics",
        "by_path answers REPLICATED for metric state too (refused when the metric is made)",
        "dpkeras/placement.py",
        "if spec.kind is VariableKind.METRIC or spec.shard is not None:",
        "if spec.shard is not None:",
        ("tests/test_placement.py::test_by_path_answers_replicated_for_a_rule_or_the_default",),
    ),
    Mutant(
        "hybrid-by-name",
        '"hybrid" (argument or DPKERAS_PARAMETER_DEVICE) is taken for a device again',
        "dpkeras/_config.py",
        'return value.strip().lower() == "hybrid"',
        "return False",
        (
            "tests/test_placement.py::test_hybrid_by_name_by_function_and_from_the_environment",
            "tests/test_cluster_training.py::"
            "test_ps_tasks_named_as_tf1_names_them_and_hybrid_by_name",
        ),
    ),
    Mutant(
        "hybrid-uncalled",
        "placement.hybrid passed without calling it is used as a policy (fails at the first "
        "variable)",
        "dpkeras/_config.py",
        "return value is placement.hybrid",
        "return False",
        ("tests/test_placement.py::test_hybrid_by_name_by_function_and_from_the_environment",),
    ),
    Mutant(
        "backup-of-another-model",
        "a backup whose weights' shapes differ from the model's is loaded: Keras's dump",
        "dpkeras/_patches/resume.py",
        "_refuse_a_backup_of_another_model(callback, _difference(saved, callback.model))",
        "pass",
        (
            "tests/test_reliability.py::"
            "test_a_backup_of_another_model_is_refused_in_one_line_naming_the_directory[shapes]",
            "tests/test_reliability.py::"
            "test_a_backup_of_another_model_is_refused_in_one_line_naming_the_directory[count]",
        ),
    ),
    Mutant(
        "backup-without-shapes",
        "a backup without shapes that Keras cannot load fails with Keras's dump",
        "dpkeras/_patches/resume.py",
        'if "could not be loaded" not in str(e):',
        "if True:",
        (
            "tests/test_reliability.py::"
            "test_a_backup_of_another_model_is_refused_in_one_line_naming_the_directory"
            "[metadata-without-shapes]",
        ),
    ),
    Mutant(
        "env-reports-own-level",
        "dpkeras env reports the TF_CPP_MIN_LOG_LEVEL=2 it set itself as the user's",
        "dpkeras/_quiet.py",
        "            _SET_HERE.add(LEVEL_VARIABLE)",
        "            pass",
        ("tests/test_quiet.py::test_dpkeras_env_reports_the_environment_as_the_user_gave_it",),
    ),
    Mutant(
        "docs-share-a-backup",
        "two docs examples share one BackupAndRestore directory (as README's and cluster.md's "
        "three did)",
        "docs/cluster.md",
        'BackupAndRestore("backup-train")',
        'BackupAndRestore("backup-mlp")',
        ("tests/test_docs_examples.py::test_no_two_blocks_share_a_backup_directory",),
    ),
    Mutant(
        "wrapper-refused",
        "keras-io's end-to-end wrapper, made outside any scope, is refused at compile again",
        "dpkeras/_patches/outside_the_scope.py",
        "            current = strategy  # compiled in the scope of the strategy it adopts\n",
        "            pass\n",
        (
            "tests/test_end_to_end_wrapper.py::"
            "test_an_end_to_end_model_made_after_training_runs_as_written[hybrid]",
        ),
    ),
    Mutant(
        "wrapper-not-adopted",
        "the wrapper compiles in its strategy's scope but runs fit/evaluate/predict under none",
        "dpkeras/_patches/outside_the_scope.py",
        "    setattr(model, _keras_internals.strategy_attribute(), strategy)",
        "    pass",
        (
            "tests/test_end_to_end_wrapper.py::"
            "test_an_end_to_end_model_made_after_training_runs_as_written[/cpu:0]",
            "tests/test_errors.py::"
            "test_a_wrapper_made_outside_any_scope_compiled_in_another_strategy_is_refused",
        ),
    ),
    Mutant(
        "wrapper-mixed-strategies",
        "a model made outside any scope with variables of two strategies compiles",
        "dpkeras/_patches/outside_the_scope.py",
        "    if not holders:\n        return\n",
        "    if True:\n        return\n",
        (
            "tests/test_errors.py::"
            "test_a_model_made_outside_any_scope_with_variables_of_two_strategies_is_refused",
        ),
    ),
    Mutant(
        "replicated-gradient-shape",
        "a replicated variable's gradient keeps its unknown static shape (a partial last batch)",
        "dpkeras/_extended/all_reduce.py",
        "    if component.shape.is_fully_defined():\n        return component\n",
        "    if True:\n        return component\n",
        (
            "tests/test_hybrid.py::"
            "test_layers_on_sequences_train_through_a_partial_last_batch[einsum_dense]",
            "tests/test_hybrid.py::"
            "test_layers_on_sequences_train_through_a_partial_last_batch[embedding_dense]",
        ),
    ),
    Mutant(
        "hybrid-saved-model-replicated",
        "a SavedModel's variables (no initial value) loaded in a hybrid scope are replicated",
        "dpkeras/_extended/creator.py",
        '            if device is placement.REPLICATED and kwargs.get("initial_value") is None:\n',
        "            if False:\n",
        (
            "tests/test_hybrid.py::"
            "test_a_saved_model_loads_in_a_hybrid_scope_as_with_every_variable_on_the_ps",
        ),
    ),
    Mutant(
        "jit-predict-before-build",
        "whether a model has replicated variables is decided before predict's first step builds it",
        "dpkeras/_patches/xla.py",
        "    if model.built:\n        return None\n",
        "    if True:\n        return None\n",
        ("tests/test_jit_predict.py::test_jit_predict_of_a_model_built_in_its_first_step[hybrid]",),
    ),
    Mutant(
        "all-reduce-before-every-replica",
        "each device joins the all-reduce as soon as its own gradients exist: a peer's failing "
        "step cancels it midway, and the workers' collectives stay aborted for later steps",
        "dpkeras/_extended/all_reduce.py",
        "with tf.device(device), tf.control_dependencies(ready):",
        "with tf.device(device):",
        (
            "tests/test_hybrid.py::"
            "test_no_device_joins_the_all_reduce_before_every_replica_has_its_gradients",
        ),
    ),
    Mutant(
        "updates-before-checks",
        "the updates do not wait for the step's checks (Assert ops): a failing check on one "
        "worker does not stop the ps from applying the step",
        "dpkeras/_extended/optimizer_apply.py",
        "    with tf.control_dependencies(_checks_of_the_step()):\n",
        "    with tf.control_dependencies([]):\n",
        ("tests/test_optimizer_apply.py::test_every_update_waits_for_the_steps_checks",),
    ),
    Mutant(
        "register-overwrites-user",
        "import dpkeras registers its stand-in over a class the user registered under its name",
        "dpkeras/_serializable.py",
        "        if registered not in registry:\n",
        "        if True:\n",
        (
            "tests/test_serializable.py::"
            "test_a_name_the_user_registered_before_import_dpkeras_is_left_as_it_is",
        ),
    ),
    Mutant(
        "restore-getattr-object",
        "uninstall() sets what getattr gave (a staticmethod's function, a classmethod bound) "
        "instead of the object the owner held in its __dict__",
        "dpkeras/_patches/entries.py",
        "        owner, _, own = saved\n"
        "        if own is _INHERITED:\n"
        "            delattr(owner, self.name)\n"
        "        else:\n"
        "            setattr(owner, self.name, own)\n",
        "        owner, original, own = saved\n"
        "        if own is _INHERITED:\n"
        "            delattr(owner, self.name)\n"
        "        else:\n"
        "            setattr(owner, self.name, original)\n",
        (
            "tests/test_keras_patches.py::"
            "test_restore_puts_back_the_object_the_owner_held_not_what_getattr_gave",
        ),
    ),
    Mutant(
        "client-filter-dies-with-group",
        "a client's filter ends on the Ctrl-C or SIGTERM that reaches the whole group: the "
        "client's last lines (its traceback) are lost",
        "dpkeras/_quiet.py",
        "import signal, sys\n"
        "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n",
        "import signal, sys\n",
        (
            "tests/test_quiet.py::"
            "test_a_client_s_filter_outlives_a_signal_to_the_group_and_passes_on_the_last_lines",
        ),
    ),
    Mutant(
        "client-drops-errors",
        "a client's filter drops TensorFlow's ERROR records of the lost-task warning's file too",
        "dpkeras/_quiet.py",
        "_CLIENT_NOISE.get(record.group(1))",
        '_CLIENT_NOISE.get("W")',
        (
            "tests/test_quiet.py::"
            "test_a_client_drops_tensorflow_s_warnings_of_a_lost_task_and_keeps_the_rest",
        ),
    ),
    Mutant(
        "hybrid-by-name-env-case",
        'DPKERAS_PARAMETER_DEVICE is "hybrid" only in lower case and without spaces (the '
        "argument in any case)",
        "dpkeras/_config.py",
        "    if _is_hybrid(text):\n        return _hybrid()\n",
        '    if text == "hybrid":\n        return _hybrid()\n',
        ("tests/test_placement.py::test_hybrid_by_name_by_function_and_from_the_environment",),
    ),
    Mutant(
        "task-type-without-index",
        "a task's device with a type but no index ('/job:ps/task:1/gpu') is taken for its CPU:0",
        "dpkeras/_device_names.py",
        "if spec.device_type is None and spec.device_index is None and named_task:",
        "if spec.device_index is None and named_task:",
        (
            "tests/test_placement.py::"
            "test_a_task_named_without_a_device_is_its_cpu_0_wherever_a_device_is_taken",
        ),
    ),
    Mutant(
        "by-path-replicated-shards",
        "by_path answers REPLICATED for a partitioned variable's shards too (refused when the "
        "table is made)",
        "dpkeras/placement.py",
        "if spec.kind is VariableKind.METRIC or spec.shard is not None:",
        "if spec.kind is VariableKind.METRIC:",
        (
            "tests/test_placement.py::"
            "test_by_path_places_the_shards_a_replicated_rule_matches_on_its_devices",
        ),
    ),
    Mutant(
        "wrapper-own-variables-unseen",
        "a wrapper made outside any scope is adopted though it has a variable of its own, of no "
        "strategy (fit then fails on it)",
        "dpkeras/_patches/outside_the_scope.py",
        "    for v in model.variables:  # the model's own variables, of no sub-layer\n",
        "    for v in ():  # the model's own variables, of no sub-layer\n",
        (
            "tests/test_errors.py::"
            "test_a_wrapper_made_outside_any_scope_with_a_variable_of_its_own_is_refused",
        ),
    ),
    Mutant(
        "jit-predict-hybrid-only",
        "an unbuilt model's predict runs without XLA under hybrid() only: a by_path policy "
        "answering REPLICATED gets an XLA step that cannot read the copies",
        "dpkeras/_patches/xla.py",
        "    return _variables_say(extended.variables())\n",
        "    return None\n",
        (
            "tests/test_jit_predict.py::"
            "test_jit_predict_of_a_model_built_in_its_first_step[by_path]",
        ),
    ),
    Mutant(
        "hybrid-saved-model-home",
        "a SavedModel loaded in a hybrid scope goes to the first parameter device only, not "
        "spread as tables are",
        "dpkeras/_extended/creator.py",
        "            return self.place(loaded)\n",
        "            return self._home or self.place(loaded)\n",
        (
            "tests/test_hybrid.py::"
            "test_a_saved_model_loads_in_a_hybrid_scope_as_with_every_variable_on_the_ps",
        ),
    ),
    Mutant(
        "docs-share-a-backup-by-keyword",
        "two docs examples share one BackupAndRestore directory, one given as backup_dir=",
        "docs/cluster.md",
        'BackupAndRestore("backup-train")',
        'BackupAndRestore(backup_dir="backup-mlp")',
        ("tests/test_docs_examples.py::test_no_two_blocks_share_a_backup_directory",),
    ),
    Mutant(
        "env-hides-level-2",
        "dpkeras env tells the user's TF_CPP_MIN_LOG_LEVEL from its own by the value: a user's "
        "2 is not reported",
        "dpkeras/_quiet.py",
        "    return None if name in _SET_HERE else os.environ.get(name)",
        "    return None if os.environ.get(name) == QUIET_LEVEL else os.environ.get(name)",
        ("tests/test_quiet.py::test_dpkeras_env_reports_the_environment_as_the_user_gave_it",),
    ),
    Mutant(
        "all-reduce-captured-per-replica",
        "ReplicaContext.all_reduce counts a tensor captured in every replica once per replica "
        "(its SUM is N times it; MirroredStrategy gives it once)",
        "dpkeras/_extended/cross_replica.py",
        "reduce_op, value, self._reduction_device(destinations), from_every_replica=False",
        "reduce_op, value, self._reduction_device(destinations), from_every_replica=True",
        ("tests/test_custom_loop.py::test_all_reduce_of_one_captured_tensor_is_that_tensor",),
    ),
    Mutant(
        "cache-keeps-graphs",
        "the graph cache holds its graphs strongly: every fit's traced steps stay alive as long "
        "as the strategy (issue 40: ~8 MB per fit in the client)",
        "dpkeras/_cache.py",
        "self._graphs = weakref.WeakSet()",
        "self._graphs = set()",
        ("tests/test_long_runs.py::test_models_fitted_and_dropped_leave_nothing_behind",),
    ),
    Mutant(
        "gpu-check-no-split",
        "make gpu-check runs one GPU as one replica instead of splitting it into logical GPUs",
        "dpkeras/testing/_gpus.py",
        "return split if len(physical_gpus) == 1 and split > 1 else 0",
        "return 0",
        ("tests/test_gpu_check.py::test_one_gpu_is_split_several_are_used_as_they_are",),
    ),
    Mutant(
        "bench-hybrid-not-hybrid",
        "the benchmark's dpkeras_hybrid runs dpkeras with every variable on the parameter device",
        "benchmarks/worker.py",
        "where = dpkeras.placement.hybrid(where)",
        "where = where",
        ("tests/test_gpu_check.py::test_on_cpu_devices_it_runs_every_gpu_test_and_the_benchmark",),
    ),
    Mutant(
        "tables-shared-by-name",
        "DynamicEmbedding's hash tables shared by TensorFlow's per-process name: a client after "
        "a killed one on the same ps is given the dead client's tables",
        "dpkeras/_dynamic/tables.py",
        "experimental_is_anonymous=True,",
        "experimental_is_anonymous=False,",
        (
            "tests/test_cluster_reshard.py::"
            "test_a_client_after_a_killed_one_starts_with_its_own_tables",
        ),
    ),
    Mutant(
        "scope-does-not-serve",
        "dpkeras.scope() takes the client's door (issue 41): in a worker task under TF_CONFIG it "
        "refuses instead of serving, so one program cannot run in every task",
        "dpkeras/_strategy/scope.py",
        "from dpkeras.cluster._task import join\n",
        "from dpkeras.cluster._task import client_of as join\n",
        (
            "tests/test_serve.py::"
            "test_a_task_whose_client_never_starts_ends_with_status_75_after_the_start_timeout",
        ),
    ),
    Mutant(
        "connect-serves",
        "dpkeras.cluster.connect takes join's door (issue 41): in a ps task under TF_CONFIG it "
        "serves and never returns instead of refusing",
        "dpkeras/cluster/_task.py",
        '    if client_of(cluster_spec, timeout, "connect as its client") is None:\n',
        "    if join(cluster_spec, timeout) is None:\n",
        (
            "tests/test_serve.py::"
            "test_connect_in_a_task_that_is_not_the_client_is_refused_naming_join",
        ),
    ),
    Mutant(
        "export-copy-0-only",
        "a SavedModel maps only copy 0 of a replicated variable: an exported function that "
        "writes state (a counter, a seed) captures an untracked copy and cannot be saved",
        "dpkeras/_variables/replicated.py",
        "tensor_map[copy.handle] = exported",
        "pass",
        (
            "tests/test_hybrid.py::"
            "test_an_export_writes_its_state_once_per_call_as_with_every_variable_on_the_ps[hybrid"
            "]",
        ),
    ),
    Mutant(
        "traced-write-per-copy",
        "a write traced outside a replica is made on each copy: exported, every copy is one "
        "variable and `assign_add` adds once per copy",
        "dpkeras/_variables/replicated.py",
        "return self._write_copy_0_then_the_others(base, args, kwargs)",
        "return self._write_every_copy(base, args, kwargs)",
        (
            "tests/test_hybrid.py::"
            "test_an_export_writes_its_state_once_per_call_as_with_every_variable_on_the_ps[hybrid"
            "]",
        ),
    ),
    Mutant(
        "sharded-update-every-pass",
        "a sharded variable runs its update in the optimizer's pass for every copy (the pass-0 "
        "rule asked of shards' writes only): the table's update computed once per compute device",
        "dpkeras/_variables/sharded.py",
        "        if pieces.writes_skipped(self._extended):\n"
        "            return placed.skipped_update(group)\n"
        "        select = self._extended.reductions.select_single_value\n",
        "        select = self._extended.reductions.select_single_value\n",
        (
            "tests/test_optimizer_apply.py::"
            "test_a_pass_for_copy_j_runs_no_update_of_a_variable_on_a_parameter_device",
        ),
    ),
    Mutant(
        "ps-update-every-pass",
        "a variable on a parameter device runs its update in the optimizer's pass for every "
        "copy (the pass-0 rule asked of its writes only)",
        "dpkeras/_variables/variables.py",
        "        if pieces.writes_skipped(self._extended):\n"
        "            return placed.skipped_update(group)\n"
        "        reductions = self._extended.reductions\n",
        "        reductions = self._extended.reductions\n",
        (
            "tests/test_optimizer_apply.py::"
            "test_a_pass_for_copy_j_runs_no_update_of_a_variable_on_a_parameter_device",
        ),
    ),
    Mutant(
        "file-share-floor",
        "FILE sharding gives a worker batch * replicas // n rows a step: an uneven step (7 over "
        "3) is cut 2 | 2, 2 instead of TensorFlow's 3 | 2, 2",
        "dpkeras/_input/sharding.py",
        "    share = shares.replica_start(end, batch, num_replicas) - shares.replica_start(\n"
        "        first, batch, num_replicas\n    )\n",
        "    share = batch * (end - first) // num_replicas\n",
        ("tests/test_input_sharding.py::test_file_cuts_an_uneven_step_by_tensorflows_rule",),
    ),
    Mutant(
        "xla-first-variable",
        "the XLA decision asks the model's first variable only: a table on the parameter device "
        "first and a replicated dense layer after it, compiled with XLA, fails",
        "dpkeras/_patches/xla.py",
        "    for variable in variables:\n        ours = placed.of(variable)\n",
        "    for variable in list(variables)[:1]:\n        ours = placed.of(variable)\n",
        (
            "tests/test_jit_predict.py::"
            "test_one_replicated_variable_after_others_decides_for_the_whole_model",
        ),
    ),
    Mutant(
        "hybrid-one-copy-unsummed",
        "a replicated variable with one copy (one compute device) is not summed per copy: its "
        "kind's sum is None, so it gets no gradient",
        "dpkeras/_extended/optimizer_apply.py",
        "    return ours is not None and bool(ours.copy_devices)",
        "    return ours is not None and len(ours.copy_devices) > 1",
        ("tests/test_hybrid.py::test_one_replica_trains_as_one_device",),
    ),
    Mutant(
        "library-write-through-internals",
        "a module outside _patches/ sets an attribute on Keras's trainer class, reached through "
        "_keras_internals (not an entry of the table, not undone by uninstall())",
        "dpkeras/_extended/keras_steps.py",
        "    owner, name = _bound_method(fn)\n    # A Keras trainer",
        "    owner, name = _bound_method(fn)\n"
        "    trainer = _keras_internals.tensorflow_trainer()\n"
        "    trainer.step_names = _STEPS\n    # A Keras trainer",
        (
            "tests/test_keras_patches.py::"
            "test_nothing_outside_dpkeras_patches_assigns_to_keras_or_tensorflow",
        ),
    ),
    Mutant(
        "lazy-export-climbs",
        "dpkeras.cluster exports `scope` from _strategy/ by name (a lazy export): an import "
        "that climbs, unseen by a check that reads `import` statements only",
        "dpkeras/cluster/__init__.py",
        '        "join": "dpkeras.cluster._task",\n',
        '        "join": "dpkeras.cluster._task",\n        "scope": "dpkeras._strategy.scope",\n',
        (
            "tests/test_package_map.py::"
            "test_the_package_map_places_every_room_on_one_floor_and_no_import_climbs",
        ),
    ),
    Mutant(
        "gradient-shape-reshaped",
        "a replicated variable's gradient of partly unknown static shape is reshaped to the "
        "variable's shape instead of checked: a gradient of the same size and another shape "
        "passes",
        "dpkeras/_extended/all_reduce.py",
        "        return tf.ensure_shape(component, shape)",
        "        return tf.reshape(component, shape)",
        (
            "tests/test_hybrid.py::"
            "test_a_gradient_of_unknown_static_shape_is_checked_on_its_device_when_it_runs",
        ),
    ),
    Mutant(
        "gradient-shape-off-device",
        "the check giving a gradient its variable's shape runs on the device in scope (the "
        "parameter device), not the replica's: the gradient crosses to it and back",
        "dpkeras/_extended/all_reduce.py",
        "    with tf.device(device):\n        return tf.ensure_shape(component, shape)",
        "    return tf.ensure_shape(component, shape)",
        (
            "tests/test_hybrid.py::"
            "test_a_gradient_of_unknown_static_shape_is_checked_on_its_device_when_it_runs",
        ),
    ),
    Mutant(
        "saved-model-hybrid-only",
        "a SavedModel's variables (no initial value) go to a parameter device under hybrid() "
        "only: a by_path policy answering REPLICATED replicates them (TensorFlow's loader fails)",
        "dpkeras/_extended/creator.py",
        '            if device is placement.REPLICATED and kwargs.get("initial_value") is None:\n',
        "            if (\n"
        "                device is placement.REPLICATED\n"
        '                and kwargs.get("initial_value") is None\n'
        "                and placement.is_hybrid(self.policy)\n"
        "            ):\n",
        (
            "tests/test_hybrid.py::"
            "test_a_saved_model_loads_under_a_by_path_policy_answering_replicated",
        ),
    ),
    Mutant(
        "uncalled-by-path-unnamed",
        "placement.by_path passed without calling it is used as a policy (fails at the first "
        "variable with by_path's own message) instead of refused by name",
        "dpkeras/placement.py",
        "    \"by_path\": \"{r'embedding': '/cpu:0'}, default='/gpu:0'\",\n",
        "",
        ("tests/test_errors.py::test_bad_devices_fail_before_anything_is_created",),
    ),
    Mutant(
        "by-path-callables-alone-refused",
        "a by_path of callables alone (no device of its own) is refused: 'needs a non-empty "
        "list of devices'",
        "dpkeras/placement.py",
        "        if candidates:\n            super().__init__(",
        "        if True:\n            super().__init__(",
        ("tests/test_placement.py::test_by_path_of_callables_alone_is_accepted",),
    ),
    Mutant(
        "readme-sync-bn-row",
        "the README's 'What is exact' table loses its BatchNormalization(synchronized=True) row",
        "README.md",
        ROW_SYNC_BN,
        "",
        ("tests/test_exact_matrix.py::test_the_readme_table_says_synchronized_batchnorm_is_exact",),
    ),
    Mutant(
        "readme-one-replica-note",
        "the Quick start no longer says that without GPUs it trains one replica",
        "README.md",
        "On a machine without GPUs this trains **one replica**, on the CPU, and says nothing "
        "about it:\nTensorFlow shows one CPU device, and it both holds the variables and "
        "computes. For replicas\nthere, make",
        "For replicas on CPUs, make",
        (
            "tests/test_docs_examples.py::"
            "test_the_quick_start_says_it_trains_one_replica_without_gpus",
        ),
    ),
    Mutant(
        "wrapper-mixed-in-own-scope",
        "a model made outside any scope with variables of two strategies is checked only when "
        "compiled with no scope: compiled in the scope of the strategy it adopts, it compiles",
        "dpkeras/_patches/outside_the_scope.py",
        "    if adopting:\n        _of_one_strategy(model, extended)\n"
        "        if not tf.distribute.has_strategy():\n",
        "    if adopting and not tf.distribute.has_strategy():\n"
        "        _of_one_strategy(model, extended)\n        if True:\n",
        (
            "tests/test_errors.py::"
            "test_a_model_with_variables_of_two_strategies_is_refused_in_either_s_scope_too",
        ),
    ),
    Mutant(
        "wrapper-adopts-once",
        "keras-io's end-to-end wrapper adopts its strategy at its first compile only: compiled "
        "again outside any scope it is refused as 'built under' the strategy (issue 42 review)",
        "dpkeras/_patches/outside_the_scope.py",
        "built_outside_any_strategy(model) or model in _ADOPTED",
        "built_outside_any_strategy(model)",
        ("tests/test_end_to_end_wrapper.py::test_the_wrapper_compiles_again_outside_any_scope",),
    ),
    Mutant(
        "mid-epoch-from-first-batch",
        "a mid-epoch backup resumes at the epoch's first batch, as Keras does (issue 44, item 3)",
        "dpkeras/_patches/resume.py",
        "    found = _RESUMPTIONS.pop(epoch_iterator, None)\n",
        "    found = _RESUMPTIONS.pop(epoch_iterator, None) and None\n",
        (
            "tests/test_resume_mid_epoch.py::"
            "test_a_mid_epoch_backup_resumes_at_the_next_batch_exactly[arrays-seeded-shuffle]",
        ),
    ),
    Mutant(
        "mid-epoch-metrics-lost",
        "the resumed epoch's metrics count only the batches after the restart",
        "dpkeras/_patches/resume.py",
        "        if metrics is not None:\n            restore_metric_states(model, metrics)\n",
        "        pass\n",
        (
            "tests/test_resume_mid_epoch.py::"
            "test_a_mid_epoch_backup_resumes_at_the_next_batch_exactly[arrays-seeded-shuffle]",
        ),
    ),
    Mutant(
        "mid-epoch-straddle-whole-group",
        "a group of steps straddling the resume point runs K batches from it, not the rest of "
        "its group",
        "dpkeras/_input/resumption.py",
        "            yield resumption.first_step, end, batches\n",
        "            yield resumption.first_step, end, iterator\n",
        (
            "tests/test_resume_mid_epoch.py::"
            "test_a_mid_epoch_backup_resumes_at_the_next_batch_exactly[arrays-k2-then-k4]",
        ),
    ),
    Mutant(
        "stream-restarts-each-epoch",
        "with steps_per_epoch over a repeated dataset, a restarted run reads the stream from its "
        "start, not where the resumed epoch began",
        "dpkeras/_input/resumption.py",
        "        return epoch * calls * steps_per_execution\n",
        "        return 0\n",
        (
            "tests/test_resume_mid_epoch.py::"
            "test_a_mid_epoch_backup_resumes_at_the_next_batch_exactly[repeated-steps-per-epoch]",
        ),
    ),
    Mutant(
        "backup-count-from-restart",
        "a resumed run counts batches toward its next backup from the restart",
        "dpkeras/_patches/resume.py",
        "            setattr(callback, last_batch_seen, done - 1)\n",
        "            pass\n",
        (
            "tests/test_resume_mid_epoch.py::"
            "test_the_resumed_run_backs_up_at_the_batches_an_uninterrupted_one_does",
        ),
    ),
    Mutant(
        "reshuffle-seen-as-deterministic",
        "a dataset reshuffled at each iteration is resumed at the next batch (on another order)",
        "dpkeras/_tf_internals.py",
        '        getattr(dataset, "_reshuffle_each_iteration", False)\n',
        "        False\n",
        (
            "tests/test_resume_mid_epoch.py::"
            "test_input_of_unknown_order_resumes_as_keras_does_with_a_warning[reshuffled-each-epoc"
            "h]",
        ),
    ),
    Mutant(
        "unseeded-map-op-unseen",
        "Keras's unseeded shuffle of arrays (tf.random.shuffle in a map) is taken as deterministic",
        "dpkeras/_input/resumption.py",
        "            if seeds.unseeded(node):\n",
        "            if False:\n",
        (
            "tests/test_resume_mid_epoch.py::"
            "test_input_of_unknown_order_resumes_as_keras_does_with_a_warning[unseeded-arrays]",
        ),
    ),
    Mutant(
        "straddle-reports-group-begin",
        "a group straddling the resume point reports its Keras begin step to callbacks, not the "
        "true first step (issue 44 review)",
        "dpkeras/_input/resumption.py",
        "            yield resumption.first_step, end, batches\n",
        "            yield begin, end, batches\n",
        (
            "tests/test_resume_mid_epoch.py::"
            "test_a_straddling_group_reports_its_true_first_step_to_callbacks",
        ),
    ),
    Mutant(
        "epoch-end-stream-not-passed",
        "an epoch-end backup of a repeated stream with steps_per_epoch restarts the stream (issue "
        "44 review)",
        "dpkeras/_patches/resume.py",
        "        if where.first_step or where.before:\n",
        "        if where.first_step:\n",
        (
            "tests/test_resume_mid_epoch.py::"
            "test_an_epoch_end_backup_of_a_repeated_stream_resumes_exactly",
        ),
    ),
    Mutant(
        "epoch-end-restores-metrics",
        "an epoch-end backup restores the last epoch's metric states into the next epoch (issue "
        "44 review)",
        "dpkeras/_patches/resume.py",
        '            metrics = None if complete else ours.get("metrics")\n',
        '            metrics = ours.get("metrics")\n',
        (
            "tests/test_resume_mid_epoch.py::"
            "test_an_epoch_end_backup_of_a_repeated_stream_resumes_exactly",
        ),
    ),
    Mutant(
        "last-epoch-iterator-noted",
        "the last epoch iterator a fit makes (an evaluate's) is taken for the one it trains on "
        "(issue 44 review)",
        "dpkeras/_patches/resume.py",
        "    if stack and stack[-1][1] is None:\n",
        "    if stack:\n",
        (
            "tests/test_resume_mid_epoch.py::"
            "test_an_evaluate_in_on_train_begin_does_not_take_the_resumption",
        ),
    ),
    Mutant(
        "seen-since-saving-kept",
        "a reused BackupAndRestore keeps its count of batches since its last save across the "
        "resume (issue 44 review)",
        "dpkeras/_patches/resume.py",
        "            setattr(callback, seen_since_saving, 0)\n",
        "            pass\n",
        (
            "tests/test_resume_mid_epoch.py::"
            "test_a_reused_callback_object_backs_up_where_an_uninterrupted_run_does",
        ),
    ),
    Mutant(
        "resumed-at-kept-across-fits",
        "a reused BackupAndRestore keeps the epoch an earlier fit resumed at (issue 44 review)",
        "dpkeras/_patches/resume.py",
        "    _RESUMED_AT.pop(callback, None)  # a callback used for an earlier fit\n",
        "    pass\n",
        (
            "tests/test_resume_mid_epoch.py::"
            "test_a_reused_callback_starting_over_counts_epochs_from_zero",
        ),
    ),
    Mutant(
        "rerandomize-unseen",
        "Dataset.random(rerandomize_each_iteration=True) is taken as deterministic (issue 44 "
        "review)",
        "dpkeras/_tf_internals.py",
        '        or getattr(dataset, "_rerandomize", False)\n',
        "        or False\n",
        ("tests/test_resume_mid_epoch.py::test_why_order_may_differ_sees[rerandomized]",),
    ),
    Mutant(
        "python-pipeline-resumed",
        "a pipeline calling Python is taken as deterministic (issue 44 review)",
        "dpkeras/_input/resumption.py",
        "    if _tf_internals.runs_python(dataset):\n",
        "    if False:\n",
        ("tests/test_resume_mid_epoch.py::test_why_order_may_differ_sees[py-function]",),
    ),
    Mutant(
        "nested-function-nodes-unseen",
        "an unseeded random op in a nested function (a tf.cond branch) is not seen (issue 44 "
        "review)",
        "dpkeras/_tf_internals.py",
        "            yield from library_function.node_def\n",
        "            yield from ()\n",
        ("tests/test_resume_mid_epoch.py::test_why_order_may_differ_sees[unseeded-in-cond]",),
    ),
    Mutant(
        "mid-pass-resumed",
        "an epoch beginning in the middle of a pass over finite data is resumed at the next batch "
        "(issue 44 review)",
        "dpkeras/_patches/resume.py",
        "    if before and num_batches is not None:\n",
        "    if False:\n",
        (
            "tests/test_resume_mid_epoch.py::"
            "test_steps_per_epoch_in_the_middle_of_a_pass_resumes_as_keras_does",
        ),
    ),
    Mutant(
        "not-by-fit-reason-lost",
        "the warning for a backup restored outside fit loses its reason (issue 44 review)",
        "dpkeras/_patches/resume.py",
        '        return None, "the backup was not restored by model.fit"\n',
        '        return None, "of an unknown reason"\n',
        ("tests/test_resume_mid_epoch.py::test_a_backup_restored_outside_fit_says_why",),
    ),
    Mutant(
        "epoch-end-as-mid-epoch",
        "a backup at an epoch's last batch is recorded as mid-epoch (issue 44 review)",
        "dpkeras/_patches/resume.py",
        "        if steps is not None and batch + 1 >= steps:\n",
        "        if steps is not None and batch + 1 > steps:\n",
        ("tests/test_resume_mid_epoch.py::test_a_backup_at_an_epochs_last_batch_is_an_epoch_end",),
    ),
    Mutant(
        "fit-stack-kept-on-exception",
        "an interrupted fit stays on the stack of running fits (issue 44 review)",
        "dpkeras/_patches/resume.py",
        "    try:\n        yield\n    finally:\n        del stack[",
        "    yield\n    if True:\n        del stack[",
        ("tests/test_resume_mid_epoch.py::test_an_interrupted_fit_leaves_no_fit_on_the_stack",),
    ),
    Mutant(
        "unknown-length-stream-resumed",
        "a stream of unknown length read on across epochs is resumed at a guessed position (issue "
        "44 review)",
        "dpkeras/_patches/resume.py",
        "        if epoch > 0 and dataset.cardinality() != tf.data.INFINITE_CARDINALITY:\n",
        "        if False:\n",
        (
            "tests/test_resume_mid_epoch.py::"
            "test_a_stream_of_unknown_length_with_steps_per_epoch_resumes_as_keras_does",
        ),
    ),
    Mutant(
        "unknown-length-last-batch-mid-epoch",
        "a backup at the last batch of data of unknown length resumes an epoch with no batch left "
        "(an empty history entry) (issue 44 review)",
        "dpkeras/_patches/resume.py",
        "        if resumption.ended_at(dataset, done):  # the last batch: not mid-epoch after "
        "all\n",
        "        if False:\n",
        (
            "tests/test_resume_mid_epoch.py::"
            "test_a_backup_at_the_last_batch_of_data_of_unknown_length_is_an_epoch_end",
        ),
    ),
    Mutant(
        "stream-from-epoch-zero",
        "a repeated stream of a fit from initial_epoch=1 is positioned as if it started at epoch "
        "0 (issue 44 review)",
        "dpkeras/_patches/resume.py",
        "        max(epoch - initial_epoch, 0), steps_per_epoch",
        "        epoch, steps_per_epoch",
        (
            "tests/test_resume_mid_epoch.py::"
            "test_a_repeated_stream_fit_from_a_later_initial_epoch_resumes_exactly",
        ),
    ),
    Mutant(
        "stateful-pipeline-resumed",
        "a pipeline drawing from a tf.random.Generator is resumed at the next batch (other draws) "
        "(issue 44 review)",
        "dpkeras/_input/resumption.py",
        '            if node.op in _STATE_CHANGING_OPS or node.op.startswith("Stateful"):\n',
        "            if False:\n",
        (
            "tests/test_resume_mid_epoch.py::"
            "test_a_pipeline_whose_random_state_lives_on_resumes_as_keras_does[generator]",
        ),
    ),
    Mutant(
        "lost-task-not-remade",
        "a lost ps's variables are not made again on it after it restarts (issue 44 item 2)",
        "dpkeras/_patches/lost_tasks.py",
        "                made += part.remake_on(task)\n",
        "                made += 0\n",
        (
            "tests/test_cluster_training.py::"
            "test_a_task_lost_mid_fit_is_waited_for_and_the_same_fit_goes_on_exactly[ps-all-on-ps-k1]",
        ),
    ),
    Mutant(
        "lost-task-functions-kept",
        "the step functions that captured a lost ps's resources are kept",
        "dpkeras/_patches/lost_tasks.py",
        "    model.train_function = model.test_function = model.predict_function = None\n",
        "    pass\n",
        (
            "tests/test_cluster_training.py::"
            "test_a_task_lost_mid_fit_is_waited_for_and_the_same_fit_goes_on_exactly[ps-all-on-ps-k1]",
        ),
    ),
    Mutant(
        "lost-task-not-reconnected",
        "the client does not connect again to a restarted ps",
        "dpkeras/_patches/lost_tasks.py",
        "        _connect.reconnect_to_restarted(task)\n",
        "        pass\n",
        (
            "tests/test_cluster_training.py::"
            "test_a_task_lost_mid_fit_is_waited_for_and_the_same_fit_goes_on_exactly[ps-all-on-ps-k1]",
        ),
    ),
    Mutant(
        "lost-task-history-last-call",
        "fit returns the history of its last call only, not every epoch",
        "dpkeras/_patches/lost_tasks.py",
        "            return _merged(histories) if len(histories) > 1 else history\n",
        "            return history\n",
        (
            "tests/test_cluster_training.py::"
            "test_a_task_lost_mid_fit_is_waited_for_and_the_same_fit_goes_on_exactly[ps-all-on-ps-k1]",
        ),
    ),
    Mutant(
        "lost-task-wait-not-off",
        "$DPKERAS_TASK_RESTART_TIMEOUT=0 does not turn the wait off",
        "dpkeras/_patches/lost_tasks.py",
        "            if timeout == 0:\n",
        "            if False:\n",
        (
            "tests/test_cluster_training.py::"
            "test_a_task_killed_mid_fit_fails_fast_and_the_run_resumes_exactly[ps-epoch]",
        ),
    ),
    Mutant(
        "lost-task-no-backup-unsaid",
        "a ps lost under a fit without a backup ends it without saying what to add",
        "dpkeras/_patches/lost_tasks.py",
        "            if backup is None or not resume.has_backup(backup):\n",
        "            if backup is None and False:\n",
        (
            "tests/test_cluster_training.py::"
            "test_a_task_lost_under_a_fit_without_a_backup_ends_it_saying_what_to_add",
        ),
    ),
    Mutant(
        "lost-worker-not-waited-for",
        "a worker lost mid-fit under all-on-ps ends fit instead of being waited for "
        "(issue 44 item 1, restarted worker)",
        "dpkeras/_patches/lost_tasks.py",
        '            if not error.task.startswith(("/job:ps/", "/job:worker/")):\n',
        '            if not error.task.startswith(("/job:ps/",)):\n',
        (
            "tests/test_cluster_training.py::"
            "test_a_task_lost_mid_fit_is_waited_for_and_the_same_fit_goes_on_exactly[worker-all-on-ps-k1]",
        ),
    ),
    Mutant(
        "hybrid-worker-copies-not-remade",
        "under hybrid a restarted worker's copies are not made again (their resources gone)",
        "dpkeras/_variables/replicated.py",
        "        for copy in lost:\n            make_resource_again(copy)\n",
        "        for copy in lost:\n            continue\n",
        (
            "tests/test_cluster_training.py::"
            "test_a_task_lost_mid_fit_is_waited_for_and_the_same_fit_goes_on_exactly[worker-hybrid-k1]",
        ),
    ),
    Mutant(
        "hybrid-collectives-after-a-loss",
        "after a worker's loss the all-reduce still uses TensorFlow's collectives (which refuse "
        "a restarted worker)",
        "dpkeras/_extended/all_reduce.py",
        "    if tf.executing_eagerly() or not collectives_trusted():\n",
        "    if tf.executing_eagerly():\n",
        (
            "tests/test_cluster_training.py::"
            "test_a_worker_lost_mid_fit_is_left_out_and_taken_back_within_float_tolerance[hybrid-k2]",
        ),
    ),
    Mutant(
        "hybrid-collectives-after-a-ps-loss",
        "after a ps's loss the all-reduce still uses TensorFlow's collectives (a worker crashed "
        "in them after the ps's restart)",
        "dpkeras/_patches/lost_tasks.py",
        "            all_reduce.lost(error.task)\n",
        "            if error.task.startswith('/job:worker/'):\n"
        "                all_reduce.lost(error.task)\n",
        (
            "tests/test_cluster_training.py::"
            "test_a_task_lost_mid_fit_is_waited_for_and_the_same_fit_goes_on_exactly[ps-hybrid-k2]",
        ),
    ),
    Mutant(
        "hybrid-copies-of-left-out-worker-kept",
        "under hybrid the copies on a left-out worker stay among the ones the step uses",
        "dpkeras/_variables/replicated.py",
        "            active = tuple(c for c in self._every_copy"
        " if canonical_device(c.device) in on)\n",
        "            active = self._every_copy\n",
        (
            "tests/test_cluster_training.py::"
            "test_a_worker_lost_mid_fit_is_left_out_and_taken_back_within_float_tolerance[hybrid-k2]",
            "tests/test_hybrid_leave_out.py::"
            "test_copies_are_those_of_the_devices_that_run_replicas_now_in_replica_order",
        ),
    ),
    Mutant(
        "hybrid-active-copies-never-recomputed",
        "under hybrid the copies a step uses are worked out once, not again when the devices "
        "change (a leave-out, a take-back)",
        "dpkeras/_variables/replicated.py",
        "        if self._active[0] is not devices:\n",
        "        if self._active[0] is None:\n",
        (
            "tests/test_hybrid_leave_out.py::"
            "test_copies_are_those_of_the_devices_that_run_replicas_now_in_replica_order",
        ),
    ),
    Mutant(
        "hybrid-copy-index-of-every-copy",
        "after a leave-out replica i touches copy i of every copy, not of the running ones (a "
        "left-out copy, when the lost worker is not the last; the cluster tests lose the last)",
        "dpkeras/_variables/replicated.py",
        "        copies = self._copies\n",
        "        copies = self._every_copy\n",
        (
            "tests/test_hybrid_leave_out.py::"
            "test_copies_are_those_of_the_devices_that_run_replicas_now_in_replica_order",
        ),
    ),
    Mutant(
        "hybrid-remake-only-running-copies",
        "a worker taken back has only its running copies made again: none, since they are made "
        "before its devices run replicas again",
        "dpkeras/_variables/replicated.py",
        "        lost = [c for c in self._every_copy if device_names.task_of(c.device) == task]\n",
        "        lost = [c for c in self._copies if device_names.task_of(c.device) == task]\n",
        (
            "tests/test_hybrid_leave_out.py::"
            "test_remake_on_makes_every_copy_of_the_task_again_even_of_a_left_out_device",
            "tests/test_cluster_training.py::"
            "test_a_worker_lost_mid_fit_is_left_out_and_taken_back_within_float_tolerance[hybrid-k2]",
        ),
    ),
    Mutant(
        "hybrid-remake-one-copy-per-task",
        "a restarted worker with two devices has only the first of its copies made again",
        "dpkeras/_variables/replicated.py",
        "        lost = [c for c in self._every_copy if device_names.task_of(c.device) == task]\n",
        "        lost = [c for c in self._every_copy if device_names.task_of(c.device) == task]"
        "[:1]\n",
        (
            "tests/test_hybrid_leave_out.py::"
            "test_remake_on_makes_every_copy_of_the_task_again_even_of_a_left_out_device",
        ),
    ),
    Mutant(
        "hybrid-taken-back-copies-not-filled",
        "a worker's copies made again keep no value until a backup is restored: a worker taken "
        "back at the start of the next fit, with no backup, fails it",
        "dpkeras/_variables/replicated.py",
        "                    copy.assign(source.read_value())\n",
        "                    pass\n",
        (
            "tests/test_cluster_training.py::"
            "test_a_worker_left_out_by_one_fit_is_taken_back_at_the_next[hybrid]",
        ),
    ),
    Mutant(
        "hybrid-taken-back-copies-filled-from-their-own",
        "a task's copies made again take the value of the first running copy, even when it is "
        "one of the task's own, made again without a value (a task waited for, worker 0)",
        "dpkeras/_variables/replicated.py",
        "        source = next((c for c in self._copies if all(c is not x for x in lost)), None)\n",
        "        source = self._copies[0]\n",
        (
            "tests/test_cluster_training.py::"
            "test_a_task_lost_mid_fit_is_waited_for_and_the_same_fit_goes_on_exactly[worker-0-hybrid-k1]",
            "tests/test_hybrid_leave_out.py::"
            "test_remake_on_makes_every_copy_of_the_task_again_even_of_a_left_out_device",
        ),
    ),
    Mutant(
        "hybrid-exchanged-sum-order-per-device",
        "the exchanged sum adds the components in another order on every device but the first "
        "(copies differ in their last bits)",
        "dpkeras/_extended/all_reduce.py",
        "                    sums.append(tf.add_n(parts))\n",
        "                    sums.append(tf.add_n(parts if device == devices[0]"
        " else parts[::-1]))\n",
        (
            "tests/test_hybrid_leave_out.py::"
            "test_after_a_lost_task_the_sum_is_exchanged_the_same_on_every_device[eager]",
            "tests/test_hybrid.py::test_eager_steps_all_reduce_too",
        ),
    ),
    Mutant(
        "lost-task-tables-not-remade",
        "a DynamicEmbedding's hash tables on a restarted ps are not made again",
        "dpkeras/_patches/lost_tasks.py",
        "            made += layer.remake_on(task)\n",
        "            made += 0\n",
        (
            "tests/test_cluster_training.py::"
            "test_a_task_lost_mid_fit_is_waited_for_and_the_same_fit_goes_on_exactly"
            "[ps-dynamic-embedding]",
        ),
    ),
    Mutant(
        "lost-task-layer-remade-twice",
        "a DynamicEmbedding held twice in a model (two submodels calling it) has its tables on a "
        "restarted task made again, and counted, twice",
        "dpkeras/_patches/lost_tasks.py",
        "    layers = {id(layer): layer for layer in resume.all_layers(model)}\n",
        "    layers = dict(enumerate(resume.all_layers(model)))\n",
        (
            "tests/test_lost_tasks.py::"
            "test_what_a_restarted_task_makes_again_counts_a_layer_held_twice_once",
        ),
    ),
    Mutant(
        "lost-task-first-deadline-kept",
        "a second task lost in one fit is waited for only until the first loss's deadline",
        "dpkeras/_patches/lost_tasks.py",
        "            deadline = time.monotonic() + timeout\n",
        "            deadline = deadline or (time.monotonic() + timeout)\n",
        ("tests/test_lost_tasks.py::test_a_second_lost_task_in_one_fit_gets_its_own_full_wait",),
    ),
    Mutant(
        "batch-through-worker-0",
        "fit's loop on a cluster is Keras's own: each worker's batch crosses to worker 0 and "
        "back every step (issue 43)",
        "dpkeras/_patches/cluster_loop.py",
        "        if step is not None:\n",
        "        if False:\n",
        (
            "tests/test_cluster_loop.py::"
            "test_a_workers_batch_is_read_on_the_worker_and_never_crosses_to_the_loop",
        ),
    ),
    Mutant(
        "hosts-never-alike",
        "no dpkeras iterator is known to give every host as many batches, so Keras's loop runs",
        "dpkeras/_input/plan.py",
        "        alike = sharding.policy_of(dataset) != sharding.AutoShardPolicy.FILE\n",
        "        alike = False\n",
        (
            "tests/test_cluster_loop.py::"
            "test_a_workers_batch_is_read_on_the_worker_and_never_crosses_to_the_loop",
        ),
    ),
    Mutant(
        "file-tuple-split",
        "FILE sharding's step cutter takes one argument: every (x, y) dataset raises TypeError",
        "dpkeras/_input/sharding.py",
        "        step = components if len(components) > 1 else components[0]\n",
        "        step = components[0]\n",
        (
            "tests/test_input_sharding.py::"
            "test_file_cuts_x_y_steps_as_one_batch_from_files_of_unequal_length",
        ),
    ),
    Mutant(
        "file-hosts-alike",
        "FILE-sharded iterators count as giving every host as many batches: worker 0's end of "
        "its files ends every worker's epoch",
        "dpkeras/_input/plan.py",
        "        alike = sharding.policy_of(dataset) != sharding.AutoShardPolicy.FILE\n",
        "        alike = True\n",
        (
            "tests/test_cluster_inputs.py::"
            "test_file_sharded_x_y_records_train_as_one_process_on_the_workers_shares",
        ),
    ),
    Mutant(
        "pack-terms-reversed",
        "a packed sum adds the workers' terms in reverse order",
        "dpkeras/_extended/packing.py",
        "    return [reductions.sum_dense(t, device) for t in terms]\n",
        "    return [reductions.sum_dense(t[::-1], device) for t in terms]\n",
        (
            "tests/test_packing.py::test_gradients_for_one_ps_cross_as_one_tensor_per_worker_dtype_and_ps",
        ),
    ),
    Mutant(
        "pack-across-ps",
        "one pack per worker for every ps, summed on the first gradient's ps",
        "dpkeras/_extended/packing.py",
        "groups.setdefault((device, components[0].dtype, sources), [])",
        "groups.setdefault((entries[0][1], components[0].dtype, sources), [])",
        (
            "tests/test_packing.py::test_gradients_for_one_ps_cross_as_one_tensor_per_worker_dtype_and_ps",
        ),
    ),
    Mutant(
        "pack-mixes-dtypes",
        "float32 and float64 gradients in one pack",
        "dpkeras/_extended/packing.py",
        "groups.setdefault((device, components[0].dtype, sources), [])",
        "groups.setdefault((device, tf.float32, sources), [])",
        (
            "tests/test_packing.py::test_gradients_for_one_ps_cross_as_one_tensor_per_worker_dtype_and_ps",
        ),
    ),
    Mutant(
        "pack-drops-own-terms",
        "a packed sum leaves out the replicas on the variable's own task",
        "dpkeras/_extended/packing.py",
        "                terms[j].append(pairs[k][1])\n",
        "                terms[j].extend([])\n",
        (
            "tests/test_packing.py::test_terms_on_the_variables_own_task_are_added_first_and_not_packed",
        ),
    ),
    Mutant(
        "presum-drops-own-terms",
        "a presum by task leaves out the first replica of the variable's own task",
        "dpkeras/_extended/reductions.py",
        "    out = [(None, c) for c in groups.pop(None, [])]\n",
        "    out = [(None, c) for c in groups.pop(None, [])][1:]\n",
        (
            "tests/test_packing.py::test_terms_on_the_variables_own_task_are_added_first_and_not_packed",
        ),
    ),
    Mutant(
        "presum-own-terms-last",
        "a presum by task adds the terms of the variable's own task last, after the other "
        "tasks' presums, not in the replicas' order",
        "dpkeras/_extended/reductions.py",
        "    out = [(None, c) for c in groups.pop(None, [])]\n"
        "    for host, parts in groups.items():\n"
        "        with tf.device(host):\n"
        "            out.append((host, _combine(parts) if len(parts) > 1 else parts[0]))\n"
        "    return out\n",
        "    own = [(None, c) for c in groups.pop(None, [])]\n"
        "    out = []\n"
        "    for host, parts in groups.items():\n"
        "        with tf.device(host):\n"
        "            out.append((host, _combine(parts) if len(parts) > 1 else parts[0]))\n"
        "    return out + own\n",
        (
            "tests/test_packing.py::"
            "test_a_presummed_sum_adds_its_own_tasks_terms_in_replica_order_then_each_tasks_presum",
        ),
    ),
    Mutant(
        "packed-on-one-machine",
        "gradients packed though nothing crosses between tasks",
        "dpkeras/_extended/packing.py",
        "        if any(sources):",
        "        if True:",
        ("tests/test_packing.py::test_nothing_is_packed_where_nothing_crosses_a_task_or_alone",),
    ),
    Mutant(
        "packed-eagerly",
        "eager gradients packed, each op a call of its own",
        "dpkeras/_extended/packing.py",
        "    if tf.executing_eagerly():\n        return [None] * len(entries)\n",
        "    if False:\n        return [None] * len(entries)\n",
        ("tests/test_packing.py::test_nothing_is_packed_where_nothing_crosses_a_task_or_alone",),
    ),
    Mutant(
        "single-gradient-flattened",
        "a gradient alone in its pack is flattened and split back",
        "dpkeras/_extended/packing.py",
        "            if len(pack) > 1:\n",
        "            if len(pack) > 0:\n",
        ("tests/test_packing.py::test_a_gradient_larger_than_a_pack_crosses_alone_with_its_shape",),
    ),
    Mutant(
        "sharded-packed",
        "a sharded variable says it sums its dense gradient on one device",
        "dpkeras/_variables/placed.py",
        'per copy)."""\n        return None\n',
        'per copy)."""\n        return getattr(self, "device", None)\n',
        (
            "tests/test_packing.py::"
            "test_a_variable_sums_its_dense_gradient_plainly_only_if_kept_whole_on_one_device",
        ),
    ),
    Mutant(
        "replicated-packed",
        "a replicated variable says it sums its dense gradient on one device",
        "dpkeras/_variables/replicated.py",
        "    @property\n    def dense_sum_device(self):\n        return None\n",
        "    @property\n    def dense_sum_device(self):\n        return self.device\n",
        (
            "tests/test_packing.py::"
            "test_a_variable_sums_its_dense_gradient_plainly_only_if_kept_whole_on_one_device",
        ),
    ),
    Mutant(
        "step-loop-first-logs",
        "each call of the per-worker loop returns its first step's logs, not its last's",
        "dpkeras/_patches/step_loop.py",
        "tf.cond(there, run, lambda: outputs), there\n",
        "(lambda new: tf.cond(step > 0, lambda: outputs, lambda: new))"
        "(tf.cond(there, run, lambda: outputs)), there\n",
        (
            "tests/test_cluster_loop.py::"
            "test_the_workers_own_loop_keeps_kerass_semantics_where_a_call_ends_early",
        ),
    ),
    Mutant(
        "step-loop-no-stop",
        "a call of the per-worker loop that finds no batch returns empty logs: no epoch end",
        "dpkeras/_patches/step_loop.py",
        "            raise StopIteration\n",
        "            return {}\n",
        (
            "tests/test_cluster_loop.py::"
            "test_the_workers_own_loop_keeps_kerass_semantics_where_a_call_ends_early",
        ),
    ),
    Mutant(
        "user-datasets-alike",
        "a user's per-worker datasets are taken to have as many batches each: worker 0 ends "
        "the epoch",
        "dpkeras/_input/plan.py",
        "self, dataset_fn, strategy, options, source=None, remake=None, alike=False",
        "self, dataset_fn, strategy, options, source=None, remake=None, alike=True",
        (
            "tests/test_cluster_loop.py::"
            "test_the_workers_own_loop_keeps_kerass_semantics_where_a_call_ends_early",
        ),
    ),
    Mutant(
        "cluster-run-eagerly",
        "run_eagerly=True is ignored on a cluster: fit and evaluate run the per-worker loop, "
        "traced, not Keras's eager steps",
        "dpkeras/_patches/step_loop.py",
        "    if model.run_eagerly or _keras_internals.unrolled_steps(model) != 1:\n",
        "    if _keras_internals.unrolled_steps(model) != 1:\n",
        ("tests/test_cluster_loop.py::test_every_steps_per_execution_equals_one_process",),
    ),
    Mutant(
        "gradients-not-packed",
        "every dense gradient crosses from its worker to the ps alone (issue 43)",
        "dpkeras/_extended/packing.py",
        "    if tf.executing_eagerly():\n        return [None] * len(entries)\n",
        "    if True:\n        return [None] * len(entries)\n",
        (
            "tests/test_cluster_loop.py::"
            "test_the_dense_gradients_a_worker_sends_to_its_ps_cross_packed_and_training_is_exact",
        ),
    ),
    Mutant(
        "reads-not-packed",
        "every dense variable a worker reads from a ps crosses alone (issue 43)",
        "dpkeras/_extended/packing.py",
        "    if pulls is None or tf.executing_eagerly() or len(pulls.entries) < 2:\n",
        "    if True:\n",
        (
            "tests/test_cluster_loop.py::"
            "test_the_dense_gradients_a_worker_sends_to_its_ps_cross_packed_and_training_is_exact",
        ),
    ),
    Mutant(
        "unused-reads-packed",
        "a variable read whole but never used (a table whose rows are gathered) is packed: it "
        "crosses whole to every worker every step",
        "dpkeras/_extended/packing.py",
        "        if not _used(pulled):\n",
        "        if False:\n",
        (
            "tests/test_packing.py::test_reads_from_one_ps_to_one_host_cross_as_one_tensor_per_dtype",
            "tests/test_cluster_loop.py::test_each_distinct_id_crosses_once_per_worker_each_way",
        ),
    ),
    Mutant(
        "reads-after-writes-packed",
        "a read the step makes after writing its variable is packed with the first reads (a "
        "cycle: the pack waits for the write, which waits for the pack)",
        "dpkeras/_variables/variables.py",
        "        return not tf.executing_eagerly() and bool(self._writes.get(True))\n",
        "        return False\n",
        (
            "tests/test_packing.py::"
            "test_a_pull_is_packed_only_as_a_first_read_before_any_write_in_the_calls_own_graph",
        ),
    ),
    Mutant(
        "nested-writes-unseen",
        "a write in a nested graph (a tf.cond branch) does not count for the graph around it",
        "dpkeras/_variables/variables.py",
        '            graph = getattr(graph, "outer_graph", None)\n',
        "            graph = None\n",
        (
            "tests/test_packing.py::"
            "test_a_pull_is_packed_only_as_a_first_read_before_any_write_in_the_calls_own_graph",
        ),
    ),
    Mutant(
        "nested-reads-packed",
        "a read in a nested graph is recorded for the call's pack (it cannot be rewired there)",
        "dpkeras/_variables/replica_step.py",
        "            tf.compat.v1.get_default_graph() is not self.graph\n            or ",
        "            ",
        (
            "tests/test_packing.py::"
            "test_a_pull_is_packed_only_as_a_first_read_before_any_write_in_the_calls_own_graph",
        ),
    ),
    Mutant(
        "control-dependent-reads-packed",
        "a read made under tf.control_dependencies on the step's values is packed with the "
        "reads those values come from: 'nodes in a cycle'",
        "dpkeras/_variables/replica_step.py",
        "            or read.op.control_inputs  # made under",
        "            or False  # made under",
        (
            "tests/test_packing.py::"
            "test_a_pull_is_packed_only_as_a_first_read_before_any_write_in_the_calls_own_graph",
            "tests/test_cluster_inputs.py::"
            "test_a_read_made_under_control_dependencies_on_the_steps_values_trains_as_one_process",
        ),
    ),
    Mutant(
        "reads-packed-only-in-training",
        "only a train step packs its reads: evaluate's and predict's cross one tensor each",
        "dpkeras/_extended/extended.py",
        "        packing.pack_reads(state.pulls)\n",
        '        packing.pack_reads(state.pulls if step == "train_step" else None)\n',
        (
            "tests/test_cluster_loop.py::"
            "test_the_dense_gradients_a_worker_sends_to_its_ps_cross_packed_and_training_is_exact",
        ),
    ),
    Mutant(
        "read-pieces-misaligned",
        "each pulled copy takes the piece of the next read in its pack",
        "dpkeras/_extended/packing.py",
        "                for (read, pulled), piece in zip(pack, pieces):\n",
        "                for (read, pulled), piece in zip(pack, pieces[1:] + pieces[:1]):\n",
        (
            "tests/test_packing.py::test_reads_from_one_ps_to_one_host_cross_as_one_tensor_per_dtype",
        ),
    ),
    Mutant(
        "pack-limit-ignored",
        "packs grow past PACK_BYTES: one tensor of every dense gradient (and read), however large",
        "dpkeras/_extended/packing.py",
        "        if current and size + nbytes(item) > PACK_BYTES:\n",
        "        if False:\n",
        (
            "tests/test_cluster_loop.py::"
            "test_the_dense_gradients_a_worker_sends_to_its_ps_cross_packed_and_training_is_exact",
        ),
    ),
    Mutant(
        "pack-split-misaligned",
        "the ps splits a pack into the wrong variables' gradients (the pack in reverse order)",
        "dpkeras/_extended/packing.py",
        "for pairs in presummed], 0)",
        "for pairs in presummed[::-1]], 0)",
        (
            "tests/test_cluster_loop.py::"
            "test_the_dense_gradients_a_worker_sends_to_its_ps_cross_packed_and_training_is_exact",
        ),
    ),
    Mutant(
        "lost-task-monitor-not-paused",
        "the health monitor keeps probing while fit waits for a lost ps: it ends the client "
        "(exit 75) once the wait outlasts its 3 failed probes",
        "dpkeras/cluster/_health.py",
        "        monitor, _monitor = _monitor, None\n",
        "        monitor = None\n",
        (
            "tests/test_cluster_training.py::"
            "test_a_ps_lost_twice_in_one_fit_is_waited_for_twice_and_the_fit_ends_exactly",
        ),
    ),
    Mutant(
        "monitor-gone-after-recovery",
        "after fit waited for a lost ps the health monitor is not started again: a task frozen "
        "later blocks the client for ever",
        "dpkeras/cluster/_health.py",
        "            watch(monitor.cluster_spec)\n",
        "            pass\n",
        (
            "tests/test_cluster_training.py::"
            "test_a_ps_lost_twice_in_one_fit_is_waited_for_twice_and_the_fit_ends_exactly",
        ),
    ),
    Mutant(
        "lost-task-tables-remade-on-live-tasks",
        "a sharded DynamicEmbedding's hash tables are made again on every ps, not only on the "
        "restarted one (the count logged is too high)",
        "dpkeras/_dynamic/tables.py",
        "            if device_names.task_of(device_names.canonical_device(device)) == task:\n",
        "            if True:\n",
        (
            "tests/test_cluster_training.py::"
            "test_a_task_lost_mid_fit_is_waited_for_and_the_same_fit_goes_on_exactly"
            "[ps-dynamic-embedding]",
        ),
    ),
    Mutant(
        "elastic-rejoin-at-first-epoch",
        "a left-out worker that answers again rejoins at the first epoch of the call that went "
        "on without it (its resumed epoch), not at the next epoch's start",
        "dpkeras/_patches/lost_tasks.py",
        "        if self._first:\n",
        "        if False:\n",
        (
            "tests/test_cluster_training.py::"
            "test_a_worker_lost_mid_fit_is_left_out_and_taken_back_within_float_tolerance[k1]",
        ),
    ),
    Mutant(
        "elastic-log-replicas-halved",
        "the line logged for a worker left out counts half the replicas left (right only for 2 "
        "workers with as many devices each)",
        "dpkeras/_patches/lost_tasks.py",
        "        len(extended.worker_devices),\n        before,\n        backup.backup_dir,\n",
        "        before // 2,\n        before,\n        backup.backup_dir,\n",
        (
            "tests/test_cluster_training.py::"
            "test_a_worker_left_out_by_one_fit_is_taken_back_at_the_next",
        ),
    ),
    Mutant(
        "elastic-log-replicas-doubled",
        "the line logged for a worker taken back counts twice the replicas it had (right only "
        "for 2 workers with as many devices each)",
        "dpkeras/_patches/lost_tasks.py",
        "        len(extended.worker_devices),\n        before,\n    )\n",
        "        2 * before,\n        before,\n    )\n",
        (
            "tests/test_cluster_training.py::"
            "test_a_worker_left_out_by_one_fit_is_taken_back_at_the_next",
        ),
    ),
    Mutant(
        "lost-task-no-backup-yet-waited",
        "a ps lost before the fit's BackupAndRestore wrote a backup is waited "
        "for (nothing to restore it from) instead of ending fit saying what to "
        "add (issue 44 review)",
        "dpkeras/_patches/lost_tasks.py",
        "            if backup is None or not resume.has_backup(backup):\n",
        "            if backup is None:\n",
        (
            "tests/test_lost_tasks.py::"
            "test_a_refused_loss_says_why_and_keeps_tensorflow_s_error[no-backup-yet]",
        ),
    ),
    Mutant(
        "rejoining-added-to-the-callbacks-given",
        "the callback that takes a worker back is appended to the user's own "
        "callbacks list (one more each call; a tuple fails) (issue 44 review)",
        "dpkeras/_patches/lost_tasks.py",
        "    arguments = dict(bound.arguments, "
        'callbacks=[*bound.arguments["callbacks"], callback])\n',
        '    arguments = dict(bound.arguments)\n    arguments["callbacks"].append(callback)\n',
        (
            "tests/test_lost_tasks.py::"
            "test_a_fit_without_a_worker_can_take_it_back_and_leaves_the_callbacks_given[list]",
            "tests/test_lost_tasks.py::"
            "test_a_fit_without_a_worker_can_take_it_back_and_leaves_the_callbacks_given[tuple]",
        ),
    ),
    Mutant(
        "elastic-one-taken-back-per-fit",
        "before a fit only the first left-out worker that answers again is "
        "taken back (issue 44 review)",
        "dpkeras/_patches/lost_tasks.py",
        "    while (task := _answering_again(spec)) is not None:\n",
        "    if (task := _answering_again(spec)) is not None:\n",
        (
            "tests/test_lost_tasks.py::"
            "test_every_left_out_worker_that_answers_again_is_taken_back_before_fit",
        ),
    ),
    Mutant(
        "elastic-second-loss-brings-back-the-first",
        "a second worker lost is left out alone: the first, still lost, runs "
        "replicas again (issue 44 review)",
        "dpkeras/_patches/lost_tasks.py",
        "        extended.compute_without([*_health.left_out(), task])\n",
        "        extended.compute_without([task])\n",
        ("tests/test_lost_tasks.py::test_a_second_worker_lost_is_left_out_with_the_first",),
    ),
    Mutant(
        "elastic-take-back-brings-back-the-others",
        "a worker taken back brings back every left-out worker's replicas, the "
        "lost ones too (issue 44 review)",
        "dpkeras/_patches/lost_tasks.py",
        "    remake_lost_resources(model, extended, task)  # "
        "placement.hybrid()'s copies there\n"
        "    extended.compute_without(_health.left_out())\n",
        "    remake_lost_resources(model, extended, task)  # "
        "placement.hybrid()'s copies there\n"
        "    extended.compute_without([])\n",
        (
            "tests/test_lost_tasks.py::"
            "test_a_worker_taken_back_mid_fit_keeps_the_others_out_and_the_epochs_before",
        ),
    ),
    Mutant(
        "elastic-rejoin-unavailable-not-retried",
        "after a worker is taken back mid-fit, an UnavailableError of a "
        "connection not back yet ends fit (issue 44 review)",
        "dpkeras/_patches/lost_tasks.py",
        "            _take_back(model, extended, back.task)\n            lost = back\n",
        "            _take_back(model, extended, back.task)\n",
        (
            "tests/test_lost_tasks.py::"
            "test_a_worker_taken_back_mid_fit_keeps_the_others_out_and_the_epochs_before",
        ),
    ),
    Mutant(
        "lost-task-history-next-call-only",
        "the History drops an epoch only where the very next call logged it: a "
        "call that logged no epoch lets a resumed epoch in twice (issue 44 "
        "review)",
        "dpkeras/_patches/lost_tasks.py",
        "        later = next((h.epoch[0] for h in kept[i + 1 :] if h.epoch), None)\n",
        "        later = kept[i + 1].epoch[0] if i + 1 < len(kept) and kept[i "
        "+ 1].epoch else None\n",
        (
            "tests/test_lost_tasks.py::"
            "test_the_history_after_a_call_that_trained_no_epoch_keeps_each_epoch_once",
        ),
    ),
    Mutant(
        "lost-task-refusal-drops-tensorflow-error",
        "a refused lost task's TaskFailedError loses TensorFlow's error "
        "(tensorflow_error None) (issue 44 review)",
        "dpkeras/_patches/lost_tasks.py",
        "        error.task, error.address, error.reason, error.tensorflow_error, advice=why\n",
        "        error.task, error.address, error.reason, None, advice=why\n",
        (
            "tests/test_lost_tasks.py::"
            "test_a_refused_loss_says_why_and_keeps_tensorflow_s_error[wait-off]",
        ),
    ),
    Mutant(
        "elastic-failed-leave-out-keeps-replicas-changed",
        "a worker that could not be left out of the connection stays left out "
        "of the replicas (issue 44 review)",
        "dpkeras/_patches/lost_tasks.py",
        "    except BaseException:\n"
        "        extended.compute_without(_health.left_out())\n"
        "        raise\n",
        "    except BaseException:\n        raise\n",
        (
            "tests/test_lost_tasks.py::"
            "test_a_worker_that_cannot_be_left_out_leaves_the_replicas_as_they_were",
        ),
    ),
    Mutant(
        "elastic-tuple-callbacks-never-rejoin",
        "a fit given its callbacks as a tuple never takes a left-out worker "
        "back mid-fit (issue 44 review)",
        "dpkeras/_patches/lost_tasks.py",
        "and isinstance(callbacks, (list, tuple)):\n",
        "and isinstance(callbacks, list):\n",
        (
            "tests/test_lost_tasks.py::"
            "test_a_fit_without_a_worker_can_take_it_back_and_leaves_the_callbacks_given[tuple]",
        ),
    ),
    Mutant(
        "elastic-rejoin-epochs-dropped",
        "the epochs of a call ended to take a worker back are missing from the "
        "History (issue 44 review)",
        "dpkeras/_patches/lost_tasks.py",
        '            histories.append(getattr(model, "history", None))\n'
        "            _take_back(model, extended, back.task)\n",
        "            _take_back(model, extended, back.task)\n",
        (
            "tests/test_lost_tasks.py::"
            "test_a_worker_taken_back_mid_fit_keeps_the_others_out_and_the_epochs_before",
        ),
    ),
    Mutant(
        "lost-task-strings-table-not-remade",
        "a string-keyed DynamicEmbedding's table of strings is not made again "
        "on a restarted ps (issue 44 review)",
        "dpkeras/_dynamic/layer.py",
        "    parts = [part for part in (self._index, self._strings) if part is not None]\n",
        "    parts = [self._index]\n",
        (
            "tests/test_lost_tasks.py::"
            "test_a_string_keyed_dynamic_embedding_has_its_strings_table_made_again_too",
        ),
    ),
    Mutant(
        "elastic-only-first-left-out-probed",
        "only the first left-out worker is asked whether it answers again: a "
        "later one is never taken back (issue 44 review)",
        "dpkeras/_patches/lost_tasks.py",
        "    for task in _health.left_out():\n        if _health.probe(",
        "    for task in _health.left_out()[:1]:\n        if _health.probe(",
        (
            "tests/test_lost_tasks.py::"
            "test_every_left_out_worker_that_answers_again_is_taken_back_before_fit",
        ),
    ),
    Mutant(
        "elastic-log-was-after-take-back",
        "the line logged for a worker taken back gives the new replica count "
        "as the old (issue 44 review)",
        "dpkeras/_patches/lost_tasks.py",
        "    before = len(extended.worker_devices)\n"
        "    _connect.take_back(task)\n"
        "    remake_lost_resources(model, extended, task)  # "
        "placement.hybrid()'s copies there\n"
        "    extended.compute_without(_health.left_out())\n",
        "    _connect.take_back(task)\n"
        "    remake_lost_resources(model, extended, task)  # "
        "placement.hybrid()'s copies there\n"
        "    extended.compute_without(_health.left_out())\n"
        "    before = len(extended.worker_devices)\n",
        (
            "tests/test_lost_tasks.py::"
            "test_a_worker_taken_back_mid_fit_keeps_the_others_out_and_the_epochs_before",
        ),
    ),
    Mutant(
        "elastic-take-back-reconnects-every-left-out",
        "a worker taken back connects this client again to every left-out "
        "worker, those still down too (issue 44 review)",
        "dpkeras/cluster/_connect.py",
        "        rest = [name for name in _health.left_out() if name != task]\n",
        "        rest = []\n",
        (
            "tests/test_elastic_workers.py::"
            "test_a_worker_taken_back_leaves_the_others_still_out_out_of_the_connection",
        ),
    ),
    Mutant(
        "elastic-take-back-trusts-collectives-again",
        "a worker taken back makes the all-reduce use TensorFlow's collectives "
        "again, which refuse the restarted worker (issue 44 review)",
        "dpkeras/_patches/lost_tasks.py",
        "    before = len(extended.worker_devices)\n    _connect.take_back(task)\n",
        "    before = len(extended.worker_devices)\n"
        "    _connect.take_back(task)\n"
        "    all_reduce._lost.discard(task)  # back: collectives again\n",
        ("tests/test_lost_tasks.py::test_a_worker_taken_back_leaves_the_sums_exchanged",),
    ),
    Mutant(
        "dedup-global-clipnorm",
        "SGD with global_clipnorm sums a repeated id's gradient rows before they cross (Keras "
        "3's global norm counts each repeat's row)",
        "dpkeras/_variables/dedup.py",
        "        and optimizer.global_clipnorm is None\n",
        "",
        (
            "tests/test_dedup.py::test_by_default_every_optimizer_equals_one_device"
            "[plain-sgd_global_clipnorm]",
        ),
    ),
    Mutant(
        "dedup-sgd-subclass-update",
        "an SGD subclass with an update_step of its own (not linear in the gradient) gets one "
        "summed row per repeated id",
        "dpkeras/_variables/dedup.py",
        "        and type(optimizer).update_step is keras.optimizers.SGD.update_step\n",
        "",
        ("tests/test_dedup.py::test_by_default_every_optimizer_equals_one_device[plain-sign_sgd]",),
    ),
    Mutant(
        "gpu-check-tests-unsplit",
        "make gpu-check splits one GPU for the benchmark but not for the tests "
        "(DPKERAS_TEST_LOGICAL_GPUS unset: the 2-GPU tests skip on one GPU)",
        "benchmarks/gpu_check.py",
        '        env["DPKERAS_TEST_LOGICAL_GPUS"] = str(logical_gpus)\n',
        "        pass\n",
        (
            "tests/test_gpu_check.py::"
            "test_on_one_gpu_both_parts_see_the_split_and_the_results_file_holds_every_part",
        ),
    ),
    Mutant(
        "gpu-check-error-passes",
        "a GPU test that errors (in a fixture, say) is counted passed in gpu-check.json",
        "benchmarks/gpu_check.py",
        'for tag in ("failure", "error", "skipped"):',
        'for tag in ("failure", "skipped"):',
        (
            "tests/test_gpu_check.py::"
            "test_a_failing_or_erroring_test_and_a_failed_pair_each_fail_the_check",
        ),
    ),
    Mutant(
        "gpu-check-failed-pair-passes",
        "a benchmark pair that failed leaves make gpu-check passed (compare.py exits 0)",
        "benchmarks/gpu_check.py",
        "if code or bad or not records:",
        "if code or not records:",
        (
            "tests/test_gpu_check.py::"
            "test_a_failing_or_erroring_test_and_a_failed_pair_each_fail_the_check",
        ),
    ),
    Mutant(
        "gpu-check-no-machine",
        "gpu-check.json does not describe the machine",
        "benchmarks/gpu_check.py",
        'json.dump({"machine": info, **summary}',
        "json.dump(summary",
        (
            "tests/test_gpu_check.py::"
            "test_on_one_gpu_both_parts_see_the_split_and_the_results_file_holds_every_part",
        ),
    ),
    Mutant(
        "gpu-check-no-bench-seconds",
        "gpu-check.json leaves out the seconds the benchmark took",
        "benchmarks/gpu_check.py",
        '        summary["seconds"]["bench"] = seconds\n',
        "",
        (
            "tests/test_gpu_check.py::"
            "test_on_one_gpu_both_parts_see_the_split_and_the_results_file_holds_every_part",
        ),
    ),
    Mutant(
        "gpu-check-exits-0-failed",
        "make gpu-check exits 0 when a test or a pair failed",
        "benchmarks/gpu_check.py",
        'return 1 if summary["status"] == "failed" else 0',
        "return 0",
        ("tests/test_gpu_check.py::test_a_failed_check_exits_1",),
    ),
    Mutant(
        "peers-auc-beside-itself",
        "a peer's AUC '(one device)' is its own AUC, not its Keras's one device's",
        "benchmarks/peers.py",
        '            r["reference_auc"] = ref["held_out_auc"]\n',
        '            r["reference_auc"] = r.get("held_out_auc")\n',
        (
            "tests/test_cluster_peers.py::test_each_peers_auc_is_beside_its_own_frameworks_one_device",
        ),
    ),
    Mutant(
        "peers-one-reference",
        "only Keras 3's one device runs: the tf-keras peers (PSS, tf-keras's MWMS) have no "
        "reference loss or distance",
        "benchmarks/peers.py",
        "            for framework in frameworks:\n",
        "            for framework in frameworks[:1]:\n",
        (
            "tests/test_cluster_peers.py::"
            "test_every_peer_runs_at_every_w_beside_one_device_of_its_own_keras",
        ),
    ),
    Mutant(
        "peers-auc-on-training",
        "a peer's held-out loss and AUC are computed on the examples it trained on",
        "benchmarks/peer_client.py",
        "held_out(config, keras, model, x_held, y_held)",
        "held_out(config, keras, model, x, y)",
        (
            "tests/test_cluster_peers.py::"
            "test_a_client_holds_out_examples_it_never_trains_on_and_trains_on_each_once",
        ),
    ),
    Mutant(
        "peers-fastest-repeat",
        "a peer's samples/s is its fastest repeat's, not the median's",
        "benchmarks/peer_client.py",
        "[(len(runs) - 1) // 2]",
        "[0]",
        ("tests/test_cluster_peers.py::test_the_median_repeat_is_reported",),
    ),
    Mutant(
        "peers-failed-row-short",
        "a peer that failed or did not run is a row with one column fewer than the table's",
        "benchmarks/peers.py",
        '" |" * 10)',
        '" |" * 9)',
        (
            "tests/test_cluster_peers.py::"
            "test_a_peer_that_raises_is_a_row_with_its_message_not_a_crash",
        ),
    ),
    Mutant(
        "recsys-report-by-k",
        "recsys's report of earlier records pairs each strategy with one device of its own K: "
        "MirroredStrategy's row (K=1) loses one device's AUC",
        "benchmarks/recsys.py",
        "records = peers.add_distances(records, by_k=False)",
        "records = peers.add_distances(records)",
        (
            "tests/test_benchmark.py::"
            "test_the_recommender_report_puts_one_devices_auc_beside_every_strategy_at_any_k",
        ),
    ),
    Mutant(
        "tf-keras-a-dependency",
        "tf-keras (the benchmark peers') becomes a dependency of dpkeras",
        "pyproject.toml",
        '    "absl-py>=2.1",\n]',
        '    "absl-py>=2.1",\n    "tf-keras==2.21.*",\n]',
        (
            "tests/test_wheel.py::test_tf_keras_is_only_the_benchmark_peers_extra_never_a_dependency",
        ),
    ),
    Mutant(
        "tf-keras-in-dev",
        "the dev extra installs tf-keras (the peers extra)",
        "pyproject.toml",
        'dev = ["dpkeras[test,bench,rs,matrix]"',
        'dev = ["dpkeras[test,bench,rs,matrix,peers]"',
        (
            "tests/test_wheel.py::test_tf_keras_is_only_the_benchmark_peers_extra_never_a_dependency",
        ),
    ),
    Mutant(
        "serve-imports-keras",
        "a dpkeras serve task imports Keras (and matplotlib) with TensorFlow again",
        "dpkeras/_cli/__init__.py",
        "        refuse_keras()\n",
        "        pass\n",
        ("tests/test_serve.py::test_a_task_starts_without_importing_keras_and_serves",),
    ),
    Mutant(
        "peers-input-ignored",
        "--input beside --peers is ignored again (every peer fits one dataset)",
        "benchmarks/cluster.py",
        '    if FLAGS.peers and FLAGS["input"].present:',
        "    if False:",
        ("tests/test_cluster_peers.py::test_input_with_peers_is_a_usage_error_naming_both",),
    ),
    Mutant(
        "serve-imports-tf-keras",
        "a dpkeras serve task refuses Keras but lets tf-keras (and TensorFlow with it) import",
        "dpkeras/cluster/_without_keras.py",
        '_REFUSED = ("keras", "tf_keras")',
        '_REFUSED = ("keras",)',
        (
            "tests/test_serve.py::test_only_keras_and_tf_keras_are_refused_and_only_before_tensorflow",
        ),
    ),
    Mutant(
        "serve-refuses-keras-prefix",
        "a dpkeras serve task refuses every module whose name starts with keras (keras_extra)",
        "dpkeras/cluster/_without_keras.py",
        '        if name.partition(".")[0] not in _REFUSED:',
        "        if not name.startswith(_REFUSED):",
        (
            "tests/test_serve.py::test_only_keras_and_tf_keras_are_refused_and_only_before_tensorflow",
        ),
    ),
    Mutant(
        "serve-refuses-beside-tensorflow",
        "refuse_keras refuses Keras in a process that imported TensorFlow already (not Keras)",
        "dpkeras/cluster/_without_keras.py",
        '    if any(name in sys.modules for name in ("tensorflow", *_REFUSED)):',
        "    if any(name in sys.modules for name in _REFUSED):",
        (
            "tests/test_serve.py::test_only_keras_and_tf_keras_are_refused_and_only_before_tensorflow",
        ),
    ),
    Mutant(
        "serve-find-spec-blind",
        "find_spec of a refused Keras gives a spec with no origin or directory (TF reads it)",
        "dpkeras/cluster/_without_keras.py",
        "        spec = importlib.machinery.PathFinder.find_spec(name, path)\n",
        "        spec = importlib.machinery.ModuleSpec(name, None)\n",
        (
            "tests/test_serve.py::test_only_keras_and_tf_keras_are_refused_and_only_before_tensorflow",
        ),
    ),
    Mutant(
        "peers-input-default-ignored",
        "--input=dataset (its default, given) beside --peers is ignored, not refused",
        "benchmarks/cluster.py",
        '    if FLAGS.peers and FLAGS["input"].present:',
        '    if FLAGS.peers and FLAGS.input != "dataset":',
        (
            "tests/test_cluster_peers.py::test_input_with_peers_is_refused_even_as_its_default_and_before_a_merge",
        ),
    ),
    Mutant(
        "peers-input-merged",
        "--input beside --peers is refused only after a --merge has written its report",
        "benchmarks/cluster.py",
        '    if FLAGS.peers and FLAGS["input"].present:',
        '    if FLAGS.peers and FLAGS["input"].present and not FLAGS.merge:',
        (
            "tests/test_cluster_peers.py::test_input_with_peers_is_refused_even_as_its_default_and_before_a_merge",
        ),
    ),
    Mutant(
        "peers-input-crash",
        "--input beside --peers is a crash (a traceback), not a usage error",
        "benchmarks/cluster.py",
        '        raise app.UsageError(\n            f"--input={FLAGS.input} applies',
        '        raise ValueError(\n            f"--input={FLAGS.input} applies',
        (
            "tests/test_cluster_peers.py::test_input_with_peers_is_refused_even_as_its_default_and_before_a_merge",
        ),
    ),
    Mutant(
        "tf1-flags-not-taken",
        "join() checks TF1's flags but does not make them this process's task: every task "
        "trains alone",
        "dpkeras/cluster/_task.py",
        "        take_task(*given)\n",
        "        pass\n",
        (
            "tests/test_tf1_flags.py::"
            "test_a_flags_script_under_absl_trains_on_worker_0_and_every_task_ends_with_status_0",
        ),
    ),
    Mutant(
        "tf1-flags-override-tf-config",
        "flags silently win over a TF_CONFIG naming another cluster or task",
        "dpkeras/cluster/_spec.py",
        "        if their_cluster != cluster or their_task != task:",
        "        if False:",
        ("tests/test_tf1_flags.py::test_flags_and_a_tf_config_that_differ_are_one_error",),
    ),
    Mutant(
        "tf1-flags-index-range",
        "a task_index one past the job's last task is taken",
        "dpkeras/cluster/_spec.py",
        "    if index >= len(tasks):",
        "    if index > len(tasks):",
        ("tests/test_tf1_flags.py::test_bad_flags_are_one_line_errors",),
    ),
    Mutant(
        "tf1-flags-launch-without-flags",
        "dpkeras launch --flags starts each task without TF1's flags (and without TF_CONFIG)",
        "dpkeras/_cli/launch.py",
        "        command = [*command, *task_flags(spec, job, index)]\n",
        "",
        (
            "tests/test_tf1_flags.py::"
            "test_launch_flags_start_each_task_with_its_flags_and_no_tf_config",
        ),
    ),
    Mutant(
        "tf1-flags-launch-keeps-tf-config",
        "dpkeras launch --flags passes TF_CONFIG on to the tasks beside the flags",
        "dpkeras/_cli/launch.py",
        "        del env[tf_config]\n",
        "",
        (
            "tests/test_tf1_flags.py::"
            "test_launch_flags_start_each_task_with_its_flags_and_no_tf_config",
        ),
    ),
    Mutant(
        "absl-quiet-own-logger",
        "under absl's app.run, dpkeras's INFO records show (no filter on the dpkeras logger)",
        "dpkeras/_quiet.py",
        '    logging.getLogger("dpkeras").addFilter(ABSL_DEFAULT)  # a filter is added once\n',
        "    pass\n",
        (
            "tests/test_quiet.py::test_dpkeras_s_info_records_show_under_absl_only_when_asked_for",
            "tests/test_quiet.py::test_a_client_under_absl_prints_what_it_prints_without_absl",
        ),
    ),
    Mutant(
        "absl-quiet-tensorflow-logger-only",
        "while connecting, only the tensorflow logger is filtered: TensorFlow's session config "
        "dump, logged through absl's logger, shows under app.run",
        "dpkeras/_quiet.py",
        'for name in ("tensorflow", "absl")]',
        'for name in ("tensorflow",)]',
        ("tests/test_quiet.py::test_a_client_under_absl_prints_what_it_prints_without_absl",),
    ),
    Mutant(
        "absl-quiet-verbosity-given",
        "an explicit --verbosity=0 under app.run is taken for absl's default: INFO hidden",
        "dpkeras/_quiet.py",
        "if verbosity.present or verbosity.value != 0",
        "if verbosity.value != 0",
        (
            "tests/test_quiet.py::"
            "test_dpkeras_s_info_records_show_under_absl_only_when_asked_for[absl-verbosity-0]",
        ),
    ),
    Mutant(
        "quiet-multi-line-record",
        "the line filter drops a record's first line only, not the protocol buffer it opens",
        "dpkeras/_quiet.py",
        "self._in_proto = not self._in_dump and bool(_PROTO_OPEN.search(text))",
        "self._in_proto = False",
        (
            "tests/test_quiet.py::test_the_filter_drops_a_multi_line_record_whole",
            "tests/test_quiet.py::test_launch_drops_a_multi_line_record_whole",
        ),
    ),
    Mutant(
        "tf1-flags-hosts-unstripped",
        "a space after a comma of --ps_hosts/--worker_hosts (a string) is kept in the address, "
        "which is then refused (a list's addresses are stripped)",
        "dpkeras/cluster/_spec.py",
        '        addresses = [address.strip() for address in hosts.split(",")]',
        '        addresses = hosts.split(",")',
        ("tests/test_tf1_flags.py::test_spaces_around_the_addresses_of_a_flag_string_are_ignored",),
    ),
    Mutant(
        "tf1-flags-second-join-other-cluster",
        "a second join as the same task of another cluster is taken without a word (the first "
        "cluster stays)",
        "dpkeras/cluster/_spec.py",
        "        if _given[0] != config:",
        '        if _given[0]["task"] != config["task"]:',
        (
            "tests/test_tf1_flags.py::"
            "test_a_second_join_as_the_same_task_of_another_cluster_is_refused",
        ),
    ),
    Mutant(
        "reserve-ended-connecting-client-holds",
        "the CONNECTING record of a client of this machine whose process ended (killed while "
        "connecting) still holds the cluster: every later client is refused",
        "dpkeras/cluster/_client_record.py",
        "    except ProcessLookupError:\n        return False",
        "    except ProcessLookupError:\n        return True",
        (
            "tests/test_cluster_clients.py::"
            "test_a_connecting_client_s_record_holds_while_its_client_may_still_connect",
        ),
    ),
    Mutant(
        "reserve-connecting-grace-reversed",
        "a CONNECTING record of another machine holds the cluster only once its grace is over",
        "dpkeras/cluster/_client_record.py",
        'alive = time.time() - record["since"] < _CONNECTING_GRACE',
        'alive = time.time() - record["since"] > _CONNECTING_GRACE',
        (
            "tests/test_cluster_clients.py::"
            "test_a_connecting_client_s_record_holds_while_its_client_may_still_connect",
        ),
    ),
    Mutant(
        "reserve-localhost-client-never-probed",
        "a training client at localhost:port of this machine is never probed: once killed, it "
        "blocks every later client ('may still run')",
        "dpkeras/cluster/_client_record.py",
        'if address.startswith("localhost:") and record["host"] != socket.gethostname():',
        'if address.startswith("localhost:"):',
        (
            "tests/test_cluster_clients.py::"
            "test_a_dead_client_of_this_machine_at_localhost_does_not_block_a_new_one",
        ),
    ),
    Mutant(
        "reserve-refused-keeps-earlier-tasks",
        "a client refused on a later task keeps its CONNECTING record on the tasks it reserved "
        "before (its own process then refuses itself)",
        "dpkeras/cluster/_client_record.py",
        "    except BaseException:\n        reservation.release()\n        raise\n"
        "    return reservation",
        "    except BaseException:\n        raise\n    return reservation",
        (
            "tests/test_cluster_clients.py::"
            "test_a_client_refused_on_a_later_task_puts_back_the_records_it_swapped_before",
        ),
    ),
    Mutant(
        "tf1-store-block-alone-not-carried",
        "a `with VariableStore():` block around strategy.run, without a scope or root reuse, is "
        "not in effect in its replicas",
        "dpkeras/tf1/_state.py",
        "    if not THREAD.scopes and not blocks and not any(s.reuse for _, s in roots.values()):",
        "    if not THREAD.scopes and not any(s.reuse for _, s in roots.values()):",
        (
            "tests/test_tf1_under_a_strategy.py::"
            "test_a_variable_store_block_alone_around_strategy_run_is_in_effect_in_every_replica",
        ),
    ),
    Mutant(
        "absl-quiet-tensorflow-filter-kept",
        "the filter on TensorFlow's loggers stays after connecting: its INFO records are dropped "
        "for the rest of the program",
        "dpkeras/_quiet.py",
        "    finally:\n        for logger in loggers:\n"
        "            logger.removeFilter(_TENSORFLOW_S)",
        "    finally:\n        pass",
        ("tests/test_quiet.py::test_tensorflow_s_records_are_judged_only_while_dpkeras_connects",),
    ),
    Mutant(
        "keras-enumeration-by-string",
        "the epoch enumeration's form chosen by comparing version strings: Keras 3.8 and 3.9 "
        '("3.8" >= "3.11") read as the (begin, end, iterator) form of 3.11+',
        "dpkeras/_keras_internals.py",
        "    if keras_minor() >= (3, 11):\n        yield from enumeration",
        '    if keras.__version__ >= "3.11":\n        yield from enumeration',
        (
            "tests/test_keras_patches.py::test_each_release_of_the_span_gets_its_own_epoch_enumeration",
        ),
    ),
    Mutant(
        "keras-optionals-from-3-11",
        "Keras 3.11's trainer asked for _autoconvert_optionals, which only 3.12+ have "
        "(AttributeError in the cluster loop on 3.11; the matrix has no Keras 3.11 pair)",
        "dpkeras/_keras_internals.py",
        "if keras_minor() < (3, 12):",
        "if keras_minor() < (3, 11):",
        (
            "tests/test_keras_patches.py::test_each_release_of_the_span_gets_its_own_optional_conversion",
        ),
    ),
    Mutant(
        "keras-backup-position-through-3-11",
        "Keras 3.11's backup position counted as 3.8-3.10's (from a call's first batch): a "
        "mid-epoch backup resumes steps_per_execution - 1 batches late",
        "dpkeras/_keras_internals.py",
        "if keras_minor() < (3, 11) and callback.model",
        "if keras_minor() <= (3, 11) and callback.model",
        (
            "tests/test_keras_patches.py::test_each_release_of_the_span_gets_its_own_backup_position",
        ),
    ),
    Mutant(
        "weights-wrapper-passes-max-shard-size",
        "the atomic weights write passes max_shard_size, which Keras 3.8-3.9's "
        "save_weights_only does not take (TypeError saving a dpkeras model there)",
        "dpkeras/_patches/resume.py",
        "sharded or not built_under_dpkeras(model):\n"
        "        return original(model, filepath, *args, **kwargs)\n"
        "    return _write(lambda tmp: original(model, tmp, *args, **kwargs)",
        "sharded or not built_under_dpkeras(model):\n"
        "        return original(model, filepath, *args, **kwargs)\n"
        "    return _write(lambda tmp: original(model, tmp, max_shard_size=None, "
        'objects_to_skip=given.get("objects_to_skip"))',
        (
            "tests/test_keras_patches.py::"
            "test_the_weights_wrapper_writes_a_dpkeras_model_through_the_3_8_signature",
        ),
    ),
    Mutant(
        "env-span-judges-tensorflow-only",
        "dpkeras env says a pair is in the span when its TensorFlow is, whatever its Keras "
        "(TensorFlow 2.21 with Keras 3.8: 'this pair is in the span')",
        "dpkeras/_cli/env.py",
        "    reason = _version.unsupported(tensorflow_version, keras_version)",
        "    reason = (\n"
        "        None if _version.in_span(tensorflow_version, _version.TENSORFLOW)\n"
        "        else _version.unsupported(tensorflow_version, keras_version)\n    )",
        ("tests/test_version.py::test_dpkeras_env_judges_the_keras_too_not_only_the_tensorflow",),
    ),
    Mutant(
        "env-refuses-outside-the-span",
        "dpkeras env raises the scope's refusal outside the span instead of printing it (the "
        "command a user runs to learn why fails)",
        "dpkeras/_cli/env.py",
        "    say(_span_line(tf.__version__, keras.__version__))",
        "    from dpkeras._version import check_supported\n\n    check_supported()\n"
        "    say(_span_line(tf.__version__, keras.__version__))",
        ("tests/test_version.py::test_dpkeras_env_runs_and_says_so_outside_the_span",),
    ),
    Mutant(
        "rs-extra-tensorflow-outside-the-span",
        "the rs extra asks for a TensorFlow the span excludes (pip then installs none, or "
        "one outside the span)",
        "pyproject.toml",
        "\"tensorflow>=2.17; python_version >= '3.11'\"",
        "\"tensorflow>=2.22; python_version >= '3.11'\"",
        ("tests/test_version.py::test_the_extras_ask_for_a_tensorflow_and_keras_within_the_span",),
    ),
)


def _copy(scratch):
    ignore = shutil.ignore_patterns(
        ".venv", ".nox", ".git", "__pycache__", "*.egg-info", "results", ".pytest_cache",
        ".ruff_cache",
    )  # fmt: skip
    shutil.copytree(ROOT, scratch, ignore=ignore)


def apply(mutant, root):
    """Applies `mutant` to the checkout at `root`; raises if its text is not there once."""
    path = os.path.join(root, mutant.path)
    with open(path) as f:
        text = f.read()
    found = text.count(mutant.old)
    if found != 1:
        raise LookupError(
            f"mutant {mutant.name!r}: {mutant.old!r} occurs {found} times in {mutant.path}, "
            f"expected exactly once; update tests/mutations.py to the moved code"
        )
    with open(path, "w") as f:
        f.write(text.replace(mutant.old, mutant.new))


def run(mutant):
    """`(verdict, seconds, last line of pytest)` of one mutant."""
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"dpkeras-mutant-{mutant.name}-") as scratch:
        root = os.path.join(scratch, "checkout")
        _copy(root)
        try:
            apply(mutant, root)
        except LookupError as e:
            return "NOT APPLIED", time.monotonic() - start, str(e)
        env = dict(os.environ, PYTHONPATH=root, PYTHONDONTWRITEBYTECODE="1")
        check = subprocess.run(
            [sys.executable, "-c", "import dpkeras; print(dpkeras.__file__)"],
            cwd=root,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        if not check.stdout.startswith(root):
            return "NOT APPLIED", time.monotonic() - start, f"imports {check.stdout.strip()}"
        command = [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:xdist",
            "-p",
            "no:cacheprovider",
            *mutant.tests,
        ]
        try:
            proc = subprocess.run(
                command, cwd=root, env=env, capture_output=True, text=True, timeout=TEST_TIMEOUT
            )
        except subprocess.TimeoutExpired:
            return "caught (timeout)", time.monotonic() - start, f"no result in {TEST_TIMEOUT} s"
    lines = proc.stdout.strip().splitlines() or ["(no output)"]
    failed = [line.split()[1].rsplit("::", 1)[-1] for line in lines if line.startswith("FAILED")]
    if proc.returncode == 0:
        verdict = "SURVIVED"
    elif proc.returncode == 1:
        verdict = "caught"
    else:  # 2-5: interrupted, internal error, usage error, nothing collected
        verdict = f"ERROR (pytest status {proc.returncode})"
    return verdict, time.monotonic() - start, f"{lines[-1]}; failed: {', '.join(failed) or '-'}"


def main(names):
    unknown = set(names) - {m.name for m in MUTANTS}
    if unknown:
        sys.exit(f"unknown mutants {sorted(unknown)}; known: {[m.name for m in MUTANTS]}")
    chosen = [m for m in MUTANTS if not names or m.name in names]
    rows = []
    for mutant in chosen:
        print(f"mutant {mutant.name}: {mutant.what} ...", flush=True)
        verdict, seconds, detail = run(mutant)
        rows.append((mutant, verdict, seconds, detail))
        print(f"  {verdict} in {seconds:.0f} s: {detail}", flush=True)
    print()
    print(f"{'mutant':<24} {'verdict':<18} {'seconds':>7}  tests")
    for mutant, verdict, seconds, _ in rows:
        tests = ", ".join(t.rsplit("::", 1)[-1] for t in mutant.tests)
        print(f"{mutant.name:<24} {verdict:<18} {seconds:>7.0f}  {tests}")
    verdicts = [verdict for _, verdict, _, _ in rows]
    if any(v.startswith(("NOT APPLIED", "ERROR")) for v in verdicts):
        return 2
    return 1 if "SURVIVED" in verdicts else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
