"""What the upstream run does not hold against `neuron`, each entry explained.

Ids are ``file::Class::test``: the test file's module name, the device-generic
class (no CPU/PRIVATEUSE1 suffix) and the test's name without its device token
(``test_clamp_cpu_float32`` -> ``test_clamp_float32``). Patterns are fnmatch
globs over ids.

SKIPS: not run on either device, grouped by cause, one line of reason each.
Nothing else is skipped by the harness (a test may still skip itself, e.g.
``@onlyCUDA``; REPORT.md counts those apart).

SKIPPED_BY_TEST: tests that skip themselves on `neuron` only (the upstream
decorator's choice), by the skip's message and, under it, by why the test
is written so.

KNOWN_DEFECTS: run, and a `neuron`-only failure there does not fail CI;
each is a device defect being fixed, with its issue. An entry none of whose
tests fails on `neuron` any more fails CI (tests/upstream/test_upstream.py),
so that it is removed once fixed.
"""
import fnmatch

SKIPS = {
    "sparse layouts (no sparse kernels on neuron; refused with NotImplementedError)": [
        ("test_masked::TestMasked::test_mask_layout_*", "builds its masks with to_sparse/to_sparse_csr, for the strided variants too"),
        ("test_torch::TestTorchDeviceType::test_grad_scaling_unscale_sparse_*", "sparse gradients"),
        ("test_autograd::TestAutogradDeviceType::test_sparse_*", "sparse_coo_tensor on the device"),
        ("test_type_promotion::TestTypePromotion::test_sparse_*", "to_sparse on the device"),
        ("test_scatter_gather_ops::TestScatterGather::test_*sparse_grad_True*", "gather's sparse gradient"),
        ("test_tensor_creation_ops::TestTensorCreation::test_tensor_ctor_device_inference", "sparse_coo_tensor's device inference"),
        ("test_numpy_interop::TestNumPyInterop::test_to_numpy_force_argument", "to_sparse on the device"),
        ("test_linalg::TestLinalg::test_svd_lowrank_*", "also runs on a sparse_coo_tensor input"),
        ("test_linalg::TestLinalg::test_pca_lowrank*", "also runs on a sparse_coo_tensor input"),
    ],
    "quantized layouts (not supported on neuron)": [
        ("test_view_ops::TestOldViewOps::test_ravel", "_empty_affine_quantized on the device"),
        ("test_view_ops::TestOldViewOps::test_flatten", "_empty_affine_quantized on the device"),
        ("test_shape_ops::TestShapeOps::test_flip_float32", "quantize_per_tensor on the device (its float32 part)"),
    ],
    "deferred data-dependent checks (raised at the next synchronisation, as on CUDA, which the tests special-case)": [
        ("test_torch::TestTorchDeviceType::test_masked_scatter_*", "a too-small source must raise at the call; skipped for CUDA only"),
        ("test_indexing::NumpyTests::test_trivial_fancy_out_of_bounds", "an out-of-range index must raise IndexError at the call"),
        ("test_indexing::TestIndexing::test_advancedindex_*", "an out-of-range index must raise IndexError at the call"),
        ("test_nn::TestNNDeviceType::test_one_hot", "an out-of-range class must raise at the call; skipped for CUDA, XLA and MPS only"),
    ],
    "tests that hard-code CUDA (expect CUDA's behaviour from any device that is not the CPU)": [
        ("test_nn::TestNNDeviceType::test_upsamplingBiMode2d_nonsupported_dtypes_*uint8*",
         "uint8 bilinear/bicubic must be refused off the CPU; neuron runs the CPU kernel, which has it"),
        ("test_linalg::TestLinalg::test_compile_int4_mm_*",
         "packs the weight with CUDA's _convert_weight_to_int4pack on any device but the CPU"),
        ("test_torch::TestTorchDeviceType::test_broadcast_fn_map*",
         "calls the CPU-only Tensor.map_/map2_ on the device; returns early for CUDA only"),
        ("test_torch::TestTorchDeviceType::test_tensor_storage_type_*",
         "expects torch.<Name>Storage, the CPU's class, from every device but CUDA; TypedStorage finds a "
         "PrivateUse1 device's class on its device module, torch.neuron.<Name>Storage (tests/test_device_module.py)"),
        ("test_sort_and_select::TestSortAndSelect::test_stable_sort_against_numpy_*",
         "index_fill with a CPU index; returns early for CUDA only, which refuses it as neuron does (tests/test_executor.py)"),
    ],
    "samples drawn from the device's generator (other data than the CPU's at the same seed, as on CUDA)": [
        ("test_modules::TestModule::test_grad*_nn_CrossEntropyLoss_float64",
         "the 2d ignore_index mean sample draws every target equal to ignore_index: a NaN loss that gradcheck "
         "fails on the CPU too, given the same data (tests/test_training.py)"),
    ],
    "larger than the emulated device's memory (TORCHNEURON_HBM_BYTES)": [
        ("test_indexing::TestIndexing::test_index_put_accumulate_large_tensor", "a 4 GiB tensor"),
    ],
}

# Tests that skip themselves on `neuron` and pass on the CPU: the upstream
# test's decorator decides, not the harness. Keyed by the skip's message; a
# neuron-only skip with a message not listed fails CI (report.problems), since
# it may hide a test that other accelerators run. Under each message, why the
# upstream tests are written so, by pattern (REPORT.md counts each group; a
# test no pattern names is counted as not yet read, which does not fail CI).
SKIPPED_BY_TEST = {
    "Only runs on cpu": (
        "`@onlyCPU`: written for the CPU alone, skipped on every accelerator (CUDA and XPU too)",
        {
            "NumPy arrays and host buffers (from_numpy, frombuffer, asarray's aliasing, __array__, NumPy scalars, "
            ".numpy()): host memory by definition": [
                "test_numpy_interop::TestNumPyInterop::*",
                "test_tensor_creation_ops::TestAsArray::*",
                "test_type_promotion::TestTypePromotion::test_numpy_*",
                "test_view_ops::TestOldViewOps::test_conj_neg_view_numpy_error",
                "test_torch::TestTorchDeviceType::test_warn_always_caught",
                "test_shape_ops::TestShapeOps::test_diagonal_multidim_*",
            ],
            "files and storages of the host or of the meta device (from_file, storage file names, "
            "TypedStorage on meta)": [
                "test_tensor_creation_ops::TestTensorCreation::test_from_file_*",
                "test_tensor_creation_ops::TestTensorCreation::test_storage_filename",
                "test_torch::TestTorchDeviceType::test_storage_meta_ok_*",
            ],
            "the CPU's own kernels (vectorised and non-vectorised paths, reduced-precision and parallel paths, "
            "fast paths for expanded indices and channels-last, its int8 matmuls, its results for non-finite "
            "float-to-int casts, its index errors at the call): "
            "one backend's implementation, as CUDA's tests cover CUDA's": [
                "test_complex::TestComplexTensor::test_eq_*",
                "test_complex::TestComplexTensor::test_ne_*",
                "test_reductions::TestReductions::test_dim_reduction_lastdim_*",
                "test_scatter_gather_ops::TestScatterGather::test_gather_expanded_index_*",
                "test_scatter_gather_ops::TestScatterGather::test_scatter_expanded_index_*",
                "test_linalg::TestLinalg::test__int_mm_cpu_*",
                "test_tensor_creation_ops::TestTensorCreation::test_float_to_int_conversion_nonfinite_*",
                "test_tensor_creation_ops::TestTensorCreation::test_cat2_*",
                "test_torch::TestTorchDeviceType::test_errors_index_copy",
                "test_torch::TestTorchDeviceType::test_gather_backward_one_dim",
                "test_linalg::TestLinalg::test__int8_mm_*",
                "test_linalg::TestLinalg::test_compile_int8_mm_*",
                "test_nn::TestNNDeviceType::test_activations_bfloat16_half_cpu_*",
                "test_nn::TestNNDeviceType::test_softmax_cpu_*",
                "test_nn::TestNNDeviceType::test_log_softmax_cpu_*",
                "test_nn::TestNNDeviceType::test_groupnorm_nhwc_*",
                "test_binary_ufuncs::TestBinaryUfuncs::test_lerp_lowp_cpu_*",
                "test_reductions::TestReductions::test_histc_lowp_*",
                "test_reductions::TestReductions::test_sum_noncontig_lowp_*",
                "test_reductions::TestReductions::test_sum_parallel",
                "test_reductions::TestReductions::test_nanmean_integral_types_*",
                "test_torch::TestTorchDeviceType::test_bfloat16_neg_abs",
            ],
            "sparse layouts built on the CPU": [
                "test_view_ops::TestOldViewOps::test_crow_col_indices",
            ],
            "quantized dtypes (CPU kernels only in PyTorch)": [
                "test_torch::TestTorchDeviceType::test_nondeterministic_resize_quantized_*",
            ],
            "device-independent behaviour tested once: the body builds its tensors on the default device, compares "
            "the meta device with the CPU, or checks shapes and dtypes (dtype inference of factories and sums, "
            "legacy constructors, views, stack, chunk, split, unbind, tolist, operator tags, modules built on meta, "
            "autograd flags of copy_)": [
                "test_tensor_creation_ops::TestTensorCreation::test_arange_inference",
                "test_tensor_creation_ops::TestRandomTensorCreation::test_randint_inference",
                "test_tensor_creation_ops::TestTensorCreation::test_as_tensor",
                "test_tensor_creation_ops::TestTensorCreation::test_constructor_dtypes",
                "test_tensor_creation_ops::TestTensorCreation::test_tensor_factory_type_inference",
                "test_tensor_creation_ops::TestTensorCreation::test_stack",
                "test_tensor_creation_ops::TestTensorCreation::test_stack_out",
                "test_shape_ops::TestShapeOps::test_unbind",
                "test_shape_ops::TestShapeOps::test_tolist",
                "test_view_ops::TestOldViewOps::test_chunk",
                "test_view_ops::TestOldViewOps::test_t",
                "test_view_ops::TestOldViewOps::test_narrow_tensor",
                "test_ops::TestTags::test_tags_*",
                "test_ops::TestCommon::test_meta_consistency_out_dtype_mismatch_*",
                "test_modules::TestModule::test_device_ctx_init_*",
                "test_autograd::TestAutogradDeviceType::test_copy_",
                "test_reductions::TestReductions::test_accreal_type",
                "test_reductions::TestReductions::test_sum_integer_upcast",
                "test_view_ops::TestOldViewOps::test_narrow",
                "test_view_ops::TestOldViewOps::test_split",
                "test_view_ops::TestOldViewOps::test_unsqueeze",
                "test_view_ops::TestOldViewOps::test_broadcast_tensors_*",
                "test_tensor_creation_ops::TestTensorCreation::test_diag_embed_*",
                "test_tensor_creation_ops::TestLikeTensorCreation::test_empty_like",
                "test_tensor_creation_ops::TestRandomTensorCreation::test_randint",
                "test_tensor_creation_ops::TestTensorCreation::test_new_tensor",
                "test_tensor_creation_ops::TestTensorCreation::test_tensor_factory",
                "test_tensor_creation_ops::TestTensorCreation::test_tensor_factory_copy_var",
                "test_tensor_creation_ops::TestTensorCreation::test_constructor_device_legacy",
            ],
        },
    ),
}

ISSUE = 51
KNOWN_DEFECTS: list[tuple[str, str, int]] = [  # (pattern, description, issue); empty: none known
]


def skip_reason(test_id):
    for cause, entries in SKIPS.items():
        for pattern, reason in entries:
            if fnmatch.fnmatchcase(test_id, pattern):
                return f"{cause}: {reason}"
    return None


def known_defect(test_id):
    """The KNOWN_DEFECTS entry (pattern, description, issue) matching test_id, or None."""
    for entry in KNOWN_DEFECTS:
        if fnmatch.fnmatchcase(test_id, entry[0]):
            return entry
    return None


def skip_patterns():
    return [p for entries in SKIPS.values() for p, _ in entries]


def own_skip_cause(test_id, message):
    """(what the decorator is, why the test is so or None) for a test that skips
    itself on neuron only with `message`; None for a message not listed."""
    entry = SKIPPED_BY_TEST.get(message)
    if entry is None:
        return None
    decorator, causes = entry
    why = next((c for c, patterns in causes.items() if any(fnmatch.fnmatchcase(test_id, p) for p in patterns)), None)
    return decorator, why


def own_skip_patterns():
    return [p for _, causes in SKIPPED_BY_TEST.values() for patterns in causes.values() for p in patterns]
