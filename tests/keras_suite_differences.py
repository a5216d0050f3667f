"""Every difference between Keras's own tests without a strategy and under dpkeras, explained.

`tests/keras_suite.py` (`make keras-suite`, and the subset in tests/test_keras_suite.py) runs
Keras's and keras-rs's shipped tests without a strategy and inside dpkeras's strategy. A test
that passes without and not within is a difference; each one is listed here with why, and with
whether it also fails under MirroredStrategy on the same devices (`mirrored`; checked when that
mode runs). A difference missing here fails the run, and so does an entry that no longer
differs: this file stays the true list. A dpkeras bug is fixed, never listed.
"""

import collections

# `sometimes`: the test fails under a strategy on some random data only (never stale then).
# `arms`: the dpkeras modes it differs in (tests/keras_suite.py's ARMS): every variable on the
# parameter device (`dpkeras`), `placement.hybrid()` (`hybrid`).
Pin = collections.namedtuple(
    "Pin", "reason mirrored sometimes arms", defaults=(False, ("dpkeras", "hybrid"))
)

_OWN_STRATEGY = (
    "the test enters its own MirroredStrategy scope, inside the scope the harness entered "
    "around it: TensorFlow refuses to nest two strategies (RuntimeError: Mixing different "
    "tf.distribute.Strategy objects)"
)

_LOSS_SCALED = (
    "calls a loss directly inside the strategy scope (cross-replica context): Keras scales a "
    "loss by 1/replicas under any strategy (`scale_loss_for_distribution`), so with 2 replicas "
    "the value is half the expected one (AssertionError: 2.488... != 4.976...)"
)

_SCIPY_REBATCH = (
    "a scipy sparse input becomes a tf.SparseTensor whose indices are not in row-major order; "
    "TensorFlow's input rebatching for the replicas (`Rebatch` in the distributed dataset) "
    "refuses it (InvalidArgumentError: indices[1] = [0,1] is out of order). The test's "
    "matrix is random, so which of these fail changes from run to run. Under hybrid a fit that "
    "gets past the rebatching fails as test_fit_sparse_tf_* does (_DENSE_REPLICATED_GRADIENT)"
)

_LSO_APPLY = (
    "calls LossScaleOptimizer.apply (or apply_gradients) directly in the strategy scope: "
    "under any strategy Keras's LossScaleOptimizer refuses it outside `strategy.run` "
    "(ValueError: apply() must be called in a replica context)"
)
_COMPUTE_LOSS_SCALED = (
    "a model's custom compute_loss updates a metric with super().compute_loss(...): under any "
    "strategy Keras returns that loss scaled by 1/replicas (`scale_loss_for_distribution`, "
    "for the replicas' gradients to sum to one device's), so the metric reads a fraction of "
    "the loss Keras logs (AssertionError: 11.46... off for `loss * 4` on 2 replicas); "
    "MirroredStrategy fails it too, with another value"
)

_XLA_CROSS_REPLICA = (
    "the test's own `tf.function(jit_compile=True)` step runs outside `strategy.run` (cross-"
    "replica context) and updates the layer's float8 scales and amax histories: under hybrid "
    "placement they are replicated, a cross-replica write goes to every copy, one per compute "
    "device, and XLA compiles a function for one device (InvalidArgumentError: Trying to access "
    "resource dense/outputs_grad_amax_history/replica_1 located in device CPU:1 from device "
    "CPU:0). All-on-ps passes (one variable, on the device the function runs on); "
    "MirroredStrategy fails it too (DistributedVariable.handle is not available outside the "
    "replica context)"
)

_PER_REPLICA_WARNING = (
    "predict traces the step once per replica, so Keras's warning about the structure of "
    "`inputs` is issued twice, not once (AssertionError: 2 != 1)"
)
_OPTIONAL_NONE_DATASET = (
    "a generator yielding None for an optional input becomes a dataset with an OptionalSpec; "
    "TensorFlow's distributed dataset cannot unbatch it (AttributeError: 'OptionalSpec' object "
    "has no attribute '_unbatch'), before any dpkeras code runs"
)
_ATOMIC_SAVE = (
    "dpkeras writes a dpkeras model's .keras file atomically (docs/reliability.md): a save "
    "that raises leaves the target as it was (here: no file), where Keras leaves a partial zip "
    "without weights, which the test asserts exists (AssertionError: False is not true)"
)

_DENSE_REPLICATED_GRADIENT = (
    "fits a Dense layer on sparse inputs and asserts that the optimizer received a sparse "
    "(tf.IndexedSlices) gradient: under placement.hybrid() the kernel is replicated and its "
    "gradient is all-reduced among the compute devices as a dense tensor (a replicated "
    "variable's copies are dense: dpkeras._extended.all_reduce), so the optimizer updates it "
    "densely (AssertionError: False is not true); the weights equal all-on-ps's, which "
    "passes. MirroredStrategy fails it too, earlier (AttributeError: 'SparseTensor' object "
    "has no attribute 'device')"
)

_COMPILE_LOSS_SCALED = (
    "calls Keras's CompileLoss directly inside the strategy scope, where Keras scales a loss "
    "for the replicas (`scale_loss_for_distribution`); MirroredStrategy gives the same, "
    "equally different value (AssertionError: not equal to tolerance)"
)

DIFFERENCES = {
    "keras/src/trainers/trainer_test.py::TestTrainer::test_metric_update_in_compute_loss": Pin(
        _COMPUTE_LOSS_SCALED, mirrored=True
    ),
    "keras/src/trainers/trainer_test.py::TestTrainer::test_evaluate_with_custom_compute_loss": (
        Pin(_COMPUTE_LOSS_SCALED, mirrored=True)
    ),
    "keras/src/trainers/trainer_test.py::TestTrainer::"
    "test_compute_loss_no_training_backwards_compatibility": Pin(
        _COMPUTE_LOSS_SCALED, mirrored=True
    ),
    "keras/src/backend/common/variables_test.py::VariableNumpyValueAndAssignmentTest::"
    "test_variable_numpy_scalar": Pin(_OWN_STRATEGY, mirrored=True),
    "keras_rs/src/losses/list_mle_loss_test.py::ListMLELossTest::test_loss_reduction": Pin(
        _LOSS_SCALED, mirrored=True
    ),
    "keras_rs/src/losses/pairwise_hinge_loss_test.py::"
    "PairwiseHingeLossTest::test_loss_reduction": Pin(_LOSS_SCALED, mirrored=True),
    "keras_rs/src/losses/pairwise_logistic_loss_test.py::"
    "PairwiseLogisticLossTest::test_loss_reduction": Pin(_LOSS_SCALED, mirrored=True),
    "keras_rs/src/losses/pairwise_mean_squared_error_test.py::"
    "PairwiseMeanSquaredErrorTest::test_loss_reduction": Pin(_LOSS_SCALED, mirrored=True),
    "keras_rs/src/losses/pairwise_soft_zero_one_loss_test.py::"
    "PairwiseSoftZeroOneLossTest::test_loss_reduction": Pin(_LOSS_SCALED, mirrored=True),
    "keras/src/trainers/trainer_test.py::TestTrainer::test_evaluate_sparse_scipy_eager": Pin(
        _SCIPY_REBATCH, mirrored=True, sometimes=True
    ),
    "keras/src/trainers/trainer_test.py::TestTrainer::test_fit_sparse_scipy_eager": Pin(
        _SCIPY_REBATCH, mirrored=True, sometimes=True
    ),
    "keras/src/trainers/trainer_test.py::TestTrainer::test_fit_sparse_scipy_graph": Pin(
        _SCIPY_REBATCH, mirrored=True, sometimes=True
    ),
    "keras/src/trainers/trainer_test.py::TestTrainer::test_predict_sparse_scipy_eager": Pin(
        _SCIPY_REBATCH, mirrored=True, sometimes=True
    ),
    "keras/src/trainers/trainer_test.py::TestTrainer::test_predict_sparse_scipy_graph": Pin(
        _SCIPY_REBATCH, mirrored=True, sometimes=True
    ),
    "keras/src/models/functional_test.py::"
    "FunctionalTest::test_warning_for_mismatched_inputs_structure": Pin(
        _PER_REPLICA_WARNING, mirrored=True
    ),
    "keras/src/models/model_test.py::"
    "ModelTest::test_functional_optional_inputs_generator_optional_none": Pin(
        _OPTIONAL_NONE_DATASET, mirrored=True
    ),
    "keras/src/optimizers/loss_scale_optimizer_test.py::"
    "LossScaleOptimizerTest::test_apply_with_no_vars": Pin(_LSO_APPLY, mirrored=True),
    "keras/src/optimizers/loss_scale_optimizer_test.py::"
    "LossScaleOptimizerTest::test_downscaling_stateful": Pin(_LSO_APPLY, mirrored=True),
    "keras/src/optimizers/loss_scale_optimizer_test.py::"
    "LossScaleOptimizerTest::test_finite_step_stateful": Pin(_LSO_APPLY, mirrored=True),
    "keras/src/optimizers/loss_scale_optimizer_test.py::"
    "LossScaleOptimizerTest::test_finite_step_with_inner_loss_scale_stateful": Pin(
        _LSO_APPLY, mirrored=True
    ),
    "keras/src/optimizers/loss_scale_optimizer_test.py::"
    "LossScaleOptimizerTest::test_finite_step_with_overwrite_stateful": Pin(
        _LSO_APPLY, mirrored=True
    ),
    "keras/src/optimizers/loss_scale_optimizer_test.py::"
    "LossScaleOptimizerTest::test_infinite_step_stateful": Pin(_LSO_APPLY, mirrored=True),
    "keras/src/optimizers/loss_scale_optimizer_test.py::"
    "LossScaleOptimizerTest::test_iterations_update_stateful": Pin(_LSO_APPLY, mirrored=True),
    "keras/src/optimizers/loss_scale_optimizer_test.py::"
    "LossScaleOptimizerTest::test_upscaling_stateful": Pin(_LSO_APPLY, mirrored=True),
    "keras/src/optimizers/multi_optimizer_test.py::"
    "MultiOptimizerTest::test_multi_optimizer_wrapped_in_loss_scale_optimizer": Pin(
        _LSO_APPLY, mirrored=True
    ),
    "keras/src/optimizers/optimizer_sparse_test.py::"
    "OptimizerSparseTest::test_sparse_correctness_loss_scale_optimizer_sgd": Pin(
        _LSO_APPLY, mirrored=True
    ),
    "keras/src/optimizers/optimizer_sparse_test.py::"
    "OptimizerSparseTest::test_sparse_gradients_loss_scale_optimizer_sgd": Pin(
        _LSO_APPLY, mirrored=True
    ),
    "keras/src/saving/saving_lib_test.py::"
    "SavingTest::test_save_model_exception_raised_high_memory_config": Pin(
        _ATOMIC_SAVE, mirrored=False
    ),
    "keras/src/saving/saving_lib_test.py::"
    "SavingTest::test_save_model_exception_raised_low_memory_config": Pin(
        _ATOMIC_SAVE, mirrored=False
    ),
    "keras/src/callbacks/swap_ema_weights_test.py::"
    "SwapEMAWeightsTest::test_swap_ema_weights_with_tf_distribute": Pin(
        _OWN_STRATEGY, mirrored=True
    ),
    "keras/src/trainers/trainer_test.py::TestTrainer::test_evaluate_sparse_scipy_graph": Pin(
        _SCIPY_REBATCH, mirrored=True, sometimes=True
    ),
    "keras/src/trainers/compile_utils_test.py::TestCompileLoss::test_dict_output_case0": Pin(
        _COMPILE_LOSS_SCALED, mirrored=True
    ),
    "keras/src/trainers/compile_utils_test.py::TestCompileLoss::test_dict_output_case1": Pin(
        _COMPILE_LOSS_SCALED, mirrored=True
    ),
    "keras/src/trainers/compile_utils_test.py::TestCompileLoss::test_list_loss_dict_data": Pin(
        _COMPILE_LOSS_SCALED, mirrored=True
    ),
    "keras/src/trainers/compile_utils_test.py::TestCompileLoss::test_list_output_case0": Pin(
        _COMPILE_LOSS_SCALED, mirrored=True
    ),
    "keras/src/trainers/compile_utils_test.py::TestCompileLoss::test_list_output_case1": Pin(
        _COMPILE_LOSS_SCALED, mirrored=True
    ),
    "keras/src/trainers/compile_utils_test.py::"
    "TestCompileLoss::test_single_output_case_with_crossentropy_loss": Pin(
        _COMPILE_LOSS_SCALED, mirrored=True
    ),
    "keras/src/trainers/compile_utils_test.py::TestCompileLoss::test_struct_loss": Pin(
        _COMPILE_LOSS_SCALED, mirrored=True
    ),
    "keras/src/trainers/compile_utils_test.py::TestCompileLoss::test_struct_loss_indice_path": Pin(
        _COMPILE_LOSS_SCALED, mirrored=True
    ),
    "keras/src/trainers/compile_utils_test.py::TestCompileLoss::test_struct_loss_namedtuple": Pin(
        _COMPILE_LOSS_SCALED, mirrored=True
    ),
    "keras/src/trainers/compile_utils_test.py::"
    "TestCompileLoss::test_struct_loss_valid_weights": Pin(_COMPILE_LOSS_SCALED, mirrored=True),
    "keras/src/trainers/trainer_test.py::TestTrainer::test_fit_sparse_tf_eager": Pin(
        _DENSE_REPLICATED_GRADIENT, mirrored=True, arms=("hybrid",)
    ),
    "keras/src/trainers/trainer_test.py::TestTrainer::test_fit_sparse_tf_graph": Pin(
        _DENSE_REPLICATED_GRADIENT, mirrored=True, arms=("hybrid",)
    ),
    "keras/src/trainers/trainer_test.py::TestTrainer::test_fit_sparse_jax_eager": Pin(
        _DENSE_REPLICATED_GRADIENT, mirrored=True, arms=("hybrid",)
    ),
    "keras/src/trainers/trainer_test.py::TestTrainer::test_fit_sparse_jax_graph": Pin(
        _DENSE_REPLICATED_GRADIENT, mirrored=True, arms=("hybrid",)
    ),
    "keras/src/layers/core/dense_test.py::DenseTest::test_quantize_float8": Pin(
        _XLA_CROSS_REPLICA, mirrored=True, arms=("hybrid",)
    ),
    "keras/src/layers/core/einsum_dense_test.py::EinsumDenseTest::test_quantize_float8": Pin(
        _XLA_CROSS_REPLICA, mirrored=True, arms=("hybrid",)
    ),
}
