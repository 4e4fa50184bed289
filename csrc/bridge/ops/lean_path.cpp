// The lean host path: unboxed kernels for the commonest operators when their
// operands are small (element-wise arithmetic, relu, sum, cat, index, mm,
// addmm).
//
// Every other call reaches the executor (../exec/executor.h) boxed: the dispatcher copies
// each argument onto an IValue stack, and the executor keys its cached meta
// pass on them. For a tensor that Python holds, each such copy and its drop
// takes the GIL (PyTorch keeps a tensor's PyObject alive while C++ holds a
// second reference): about 2K of the 15K host instructions of a tiny `x + y`.
//
// These kernels take their arguments as they come. When the operands are
// contiguous neuron tensors on the current device with one dtype and one
// shape, and too small to fuse, nothing needs computing to know the result:
// TensorIterator gives such operands a contiguous result of their dtype and
// coalesces them into one dimension, so the task runs the CPU kernel on flat
// aliases, the very loop the CPU backend runs; a sum of all elements reduces
// them in the same order, into a 0-dim result. A cat of such tensors, or a
// selection of rows by an int64 index, is a copy of rows, which the task
// makes itself. A matrix product of contiguous or transposed matrices (a
// Linear layer's `x @ w.t()`) runs the CPU kernel on aliases of the same
// layouts: the same gemm call. A Python number as the second operand of
// add, sub, mul or div (`a * 0.999`: PyTorch passes it as a wrapped
// zero-dimensional CPU tensor) is taken by value (HostScalar) and given to the
// CPU kernel as the same wrapped tensor, when the result keeps the tensor's
// dtype. Anything else (broadcasting, type promotion, other CPU tensors,
// strided views, fusable sizes, an error to raise) takes the boxed path
// unchanged.
#include <ATen/EmptyTensor.h>
#include <ATen/ops/add_cpu_dispatch.h>
#include <ATen/ops/addmm_cpu_dispatch.h>
#include <ATen/ops/clamp_min_cpu_dispatch.h>
#include <ATen/ops/div_cpu_dispatch.h>
#include <ATen/ops/mm_cpu_dispatch.h>
#include <ATen/ops/mul_cpu_dispatch.h>
#include <ATen/ops/sub_cpu_dispatch.h>
#include <ATen/ops/sum_cpu_dispatch.h>
#include <ATen/native/TypeProperties.h>
#include <c10/core/WrapDimMinimal.h>

#include <cstring>

#include "../allocator.h"
#include "../device_state.h"
#include "../exec/executor.h"
#include "../exec/fusion_offer.h"
#include "../exec/host_scalar.h"
#include "../exec/host_views.h"
#include "../exec/thread_count.h"
#include "../sanitizers/memcheck.h"
#include "../sanitizers/op_tracking.h"
#include "explicit_ops.h"

namespace torchneuron::ops {
namespace {

// The CPU kernel a task runs, on flat host views of its output and operands.
using LeanKernel = void (*)(at::Tensor& out, const at::Tensor& a, const at::Tensor& b);

// A CPU tensor of `sizes` at `data`: contiguous, or with the strides of a
// transposed matrix.
at::Tensor alias(const void* data, c10::IntArrayRef sizes, c10::ScalarType dtype, bool transposed = false) {
  if (memcheck::on()) memcheck::viewed(data);
  const auto meta = c10::scalarTypeToTypeMeta(dtype);
  c10::Storage storage(c10::Storage::use_byte_size_t(), c10::multiply_integers(sizes) * meta.itemsize(),
                       c10::DataPtr(const_cast<void*>(data), c10::Device(c10::kCPU)), nullptr, false);
  auto t = at::detail::make_tensor<c10::TensorImpl>(std::move(storage), c10::DispatchKeySet(c10::DispatchKey::CPU), meta);
  if (transposed) t.unsafeGetTensorImpl()->set_sizes_and_strides(sizes, {1, sizes[0]});
  else t.unsafeGetTensorImpl()->set_sizes_contiguous(sizes);
  return t;
}

// A whole task, kept inline in the task body (no allocation per launch).
struct LeanTask {
  LeanKernel kernel;
  void* out;
  const void* a;
  const void* b;
  int64_t numel;
  c10::ScalarType dtype;
  bool binary;  // (b is null for an empty operand, so it cannot say)
  bool reduces;  // out holds one element: a reduction of all of a

  void operator()() const {
    auto guard = below_autograd();
    follow_host_thread_count();
    at::Tensor o = alias(out, reduces ? c10::IntArrayRef() : c10::IntArrayRef(numel), dtype);
    kernel(o, alias(a, numel, dtype), binary ? alias(b, numel, dtype) : at::Tensor());
  }
};

// A task of one operand and a Python number: the CPU kernel on a flat host
// view of the operand and the number as the wrapped tensor it came as.
struct LeanScalarTask {
  LeanKernel kernel;
  void* out;
  const void* a;
  int64_t numel;
  HostScalar number;
  c10::ScalarType dtype;

  void operator()() const {
    auto guard = below_autograd();
    follow_host_thread_count();
    at::Tensor o = alias(out, numel, dtype);
    kernel(o, alias(a, numel, dtype), number.alias());
  }
};
static_assert(sizeof(LeanScalarTask) <= 64, "kept inline in its task body (runtime/task.h), as LeanTask is");

// A non-empty neuron tensor with row-major strides, size-1 dimensions' too
// (the CPU's kernels lay results out after them, and give empty results
// other strides), and no conj or neg bit.
bool plain(const at::Tensor& t) {
  if (!t.defined() || t.device().type() != kNeuron || !t.is_contiguous() || t.is_conj() || t.is_neg() ||
      t.numel() == 0)
    return false;
  const auto sizes = t.sizes(), strides = t.strides();
  int64_t step = 1;
  for (size_t d = sizes.size(); d-- > 0; step *= sizes[d])
    if (strides[d] != step) return false;
  return true;
}

// Whether a call on `a` (and `b`) can take the lean path: see the top.
bool lean_operands(const at::Tensor& a, const at::Tensor& b = {}) {
  if (!plain(a) || a.device().index() != current_device() || a.numel() >= min_fusable_numel()) return false;
  return !b.defined() || (plain(b) && b.device() == a.device() && b.scalar_type() == a.scalar_type() &&
                          b.sizes() == a.sizes());
}

// Whether `self op other` can take the lean path as a tensor and a Python
// number: `self` passes lean_operands, `other` is a number PyTorch wrapped,
// and the result keeps self's dtype (a float tensor times an int, not an int
// tensor times a float).
bool lean_with_number(const at::Tensor& self, const at::Tensor& other) {
  if (!other.defined() || !other.unsafeGetTensorImpl()->is_wrapped_number() || !HostScalar::fits(other) ||
      !lean_operands(self))
    return false;
  at::native::ResultTypeState state;
  state = at::native::update_result_type_state(self, state);
  state = at::native::update_result_type_state(other, state);
  return at::native::result_type(state) == self.scalar_type();
}

// One operator: its schema, for the boxed path, and its slot in op tracking.
struct Op {
  c10::OperatorHandle handle;
  OpCounter& counter;
  std::string name;
  Op(const char* op, const char* overload)
      : handle(c10::Dispatcher::singleton().findSchemaOrThrow(op, overload)),
        counter(op_counter(handle.schema().operator_name())),
        name(std::string(op) + (*overload ? std::string(".") + overload : "")) {}

  template <class... Args>
  at::Tensor boxed(const Args&... args) const {
    torch::jit::Stack stack;
    stack.reserve(sizeof...(args));
    (stack.emplace_back(args), ...);
    execute(handle, &stack);
    return std::move(stack.back()).toTensor();
  }

  // Queues `task` on `device`'s current stream as a call of this operator.
  template <class Task>
  void queue(c10::DeviceIndex device, Task&& task) const {
    translate_errors([&] {
      current_runtime_stream(device).enqueue(rt::TaskName::borrow(name), std::forward<Task>(task));
    });
    record_execution(counter, Execution::Queued);
  }
};

at::Tensor empty_contiguous(c10::IntArrayRef sizes, c10::ScalarType dtype) {
  return memcheck::named(at::detail::empty_generic(
      sizes, &device_allocator(), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), dtype, c10::MemoryFormat::Contiguous));
}

// `a` (and `b`) passed lean_operands. The result has a's shape, or none if
// the kernel `reduces` all of a.
at::Tensor launch(const Op& op, LeanKernel kernel, const at::Tensor& a, const at::Tensor& b = {}, bool reduces = false) {
  at::Tensor out = empty_contiguous(reduces ? c10::IntArrayRef() : a.sizes(), a.scalar_type());
  op.queue(a.device().index(), LeanTask{kernel, out.data_ptr(), a.const_data_ptr(),
                                        b.defined() ? b.const_data_ptr() : nullptr, a.numel(), a.scalar_type(),
                                        b.defined(), reduces});
  return out;
}

// `self` and `number` passed lean_with_number. A Python float with a float32
// tensor reaches the kernel as the float32 it rounds to: the CPU kernel
// converts it so before any use (TensorIterator's cast of a CPU scalar to the
// common dtype, or the kernel's own reading of the original value as its
// float32 opmath type), one rounding either way, and the task skips the
// conversion's dispatched allocation and copy. Half and bfloat16 tensors keep
// the double: their kernels compute with it in float32, not in their dtype.
at::Tensor launch_with_number(const Op& op, LeanKernel kernel, const at::Tensor& self, const at::Tensor& number) {
  at::Tensor out = empty_contiguous(self.sizes(), self.scalar_type());
  HostScalar value(number);
  if (self.scalar_type() == at::kFloat && value.dtype() == at::kDouble)
    value = HostScalar::float32(static_cast<float>(value.value<double>()), value.wrapped());
  op.queue(self.device().index(),
           LeanScalarTask{kernel, out.data_ptr(), self.const_data_ptr(), self.numel(), value, self.scalar_type()});
  return out;
}

bool is_one(const at::Scalar& alpha) { return alpha.isIntegral(false) && alpha.to<int64_t>() == 1; }

// A cat of contiguous tensors along `dim`: each of the `rows` rows of the
// output (the product of the sizes before `dim`) is every input's row in turn.
struct CatTask {
  void* out;
  int64_t rows;
  c10::SmallVector<std::pair<const void*, int64_t>, 4> inputs;  // data, bytes per row

  void operator()() const {
    auto* o = static_cast<char*>(out);
    for (int64_t r = 0; r < rows; ++r) {
      for (const auto& [data, bytes] : inputs) {
        if (bytes == 0) continue;
        std::memcpy(o, static_cast<const char*>(data) + r * bytes, bytes);
        o += bytes;
      }
    }
  }
};

// A (bias +) matrix product: the CPU kernel on aliases with the operands'
// own layouts, so the gemm call is the CPU backend's.
struct MatmulTask {
  void* out;
  const void* a;
  const void* b;
  const void* bias;  // null: mm
  int64_t m, k, n;
  c10::ScalarType dtype;
  bool a_transposed, b_transposed, bias_is_row;

  void operator()() const {
    auto guard = below_autograd();
    follow_host_thread_count();
    at::Tensor o = alias(out, {m, n}, dtype);
    const at::Tensor x = alias(a, {m, k}, dtype, a_transposed), y = alias(b, {k, n}, dtype, b_transposed);
    if (!bias) at::cpu::mm_out(o, x, y);
    else at::cpu::addmm_out(o, bias_is_row ? alias(bias, {n}, dtype) : alias(bias, {m, n}, dtype), x, y);
  }
};

// A 2-D operand with the strides of a row-major matrix or of the transpose
// of one: exactly those an alias gets (even where a size of 1 leaves them
// free), since the CPU kernel picks its gemm call by strides.
bool matrix(const at::Tensor& t, bool& transposed) {
  if (!t.defined() || t.device().type() != kNeuron || t.dim() != 2 || t.is_conj() || t.is_neg()) return false;
  transposed = !(t.stride(0) == t.size(1) && t.stride(1) == 1);
  return !transposed || (t.stride(0) == 1 && t.stride(1) == t.size(0));
}

// The task for `a @ b` when both are small matrices of one floating dtype on
// the current device (out and bias still to fill in).
std::optional<MatmulTask> small_matmul(const at::Tensor& a, const at::Tensor& b) {
  MatmulTask t{};
  if (!matrix(a, t.a_transposed) || !matrix(b, t.b_transposed) || a.device() != b.device() ||
      a.device().index() != current_device() || a.scalar_type() != b.scalar_type() ||
      !at::isFloatingType(a.scalar_type()) || a.size(1) != b.size(0))
    return std::nullopt;
  t.m = a.size(0), t.k = a.size(1), t.n = b.size(1);
  const int64_t limit = min_fusable_numel();
  if (a.numel() >= limit || b.numel() >= limit || t.m * t.n >= limit) return std::nullopt;
  t.a = a.const_data_ptr(), t.b = b.const_data_ptr(), t.dtype = a.scalar_type();
  return t;
}

at::Tensor launch(const Op& op, MatmulTask task, c10::DeviceIndex device) {
  at::Tensor out = empty_contiguous({task.m, task.n}, task.dtype);
  task.out = out.data_ptr();
  op.queue(device, task);
  return out;
}

// `self[index]` for an int64 index: rows of `self` along its first dimension,
// copied in the order of the index. Each index is checked as ATen's CPU
// kernel checks it, with its message; the error reaches the host at the next
// synchronising call (the index lives on the device).
struct GatherRowsTask {
  void* out;
  const void* self;
  const int64_t* index;
  int64_t count, rows, row_bytes;

  void operator()() const {
    if (row_bytes == 0) return;  // rows of no elements: ATen's loop checks nothing either
    auto* o = static_cast<char*>(out);
    for (int64_t i = 0; i < count; ++i, o += row_bytes) {
      int64_t r = index[i];
      TORCH_CHECK_INDEX(r >= -rows && r < rows, "index ", r, " is out of bounds for dimension 0 with size ", rows);
      std::memcpy(o, static_cast<const char*>(self) + (r < 0 ? r + rows : r) * row_bytes, row_bytes);
    }
  }
};

} // namespace

// One contiguous int64 index on the first dimension of a small tensor; masks,
// several indices and CPU indices take the boxed path.
at::Tensor index_tensor(const at::Tensor& self, const c10::List<std::optional<at::Tensor>>& indices) {
  static const Op op("aten::index", "Tensor");
  if (indices.size() == 1 && self.dim() >= 1 && lean_operands(self)) {
    const std::optional<at::Tensor> index = indices.get(0);
    const int64_t row_numel = c10::multiply_integers(self.sizes().slice(1));
    if (index && plain(*index) && index->device() == self.device() && index->scalar_type() == at::kLong &&
        index->numel() * row_numel < min_fusable_numel()) {  // (large results: ATen's kernel uses every thread)
      std::vector<int64_t> sizes = index->sizes().vec();
      sizes.insert(sizes.end(), self.sizes().begin() + 1, self.sizes().end());
      at::Tensor out = empty_contiguous(sizes, self.scalar_type());
      const int64_t row_bytes = row_numel * static_cast<int64_t>(self.itemsize());
      op.queue(self.device().index(), GatherRowsTask{out.data_ptr(), self.const_data_ptr(),
                                                     index->const_data_ptr<int64_t>(), index->numel(), self.size(0),
                                                     row_bytes});
      return out;
    }
  }
  return op.boxed(self, indices);
}

at::Tensor mm(const at::Tensor& self, const at::Tensor& mat2) {
  static const Op op("aten::mm", "");
  if (auto task = small_matmul(self, mat2)) return launch(op, *task, self.device().index());
  return op.boxed(self, mat2);
}

// With beta = alpha = 1 and a bias of one row or of the result's shape.
at::Tensor addmm(const at::Tensor& self, const at::Tensor& mat1, const at::Tensor& mat2, const at::Scalar& beta,
                 const at::Scalar& alpha) {
  static const Op op("aten::addmm", "");
  auto task = is_one(beta) && is_one(alpha) && plain(self) ? small_matmul(mat1, mat2) : std::nullopt;
  if (task && self.device() == mat1.device() && self.scalar_type() == task->dtype &&
      (self.sizes() == c10::IntArrayRef{task->n} || self.sizes() == c10::IntArrayRef{task->m, task->n})) {
    task->bias = self.const_data_ptr();
    task->bias_is_row = self.dim() == 1;
    return launch(op, *task, self.device().index());
  }
  return op.boxed(self, mat1, mat2, beta, alpha);
}

at::Tensor cat(const at::ITensorListRef& tensors, int64_t dim) {
  static const Op op("aten::cat", "");
  // Up to three dimensions: the CPU kernel gives 4- and 5-dimensional results
  // a memory format from its inputs' strides.
  const at::Tensor* first = nullptr;
  int64_t numel = 0, cat_size = 0;
  bool lean = true;
  for (const at::Tensor& t : tensors) {
    if (!first) {
      first = &t;
      lean = lean_operands(t) && t.dim() >= 1 && t.dim() <= 3 && dim >= -t.dim() && dim < t.dim();
      if (lean) dim = c10::maybe_wrap_dim(dim, t.dim());
    } else {
      lean = lean && plain(t) && t.device() == first->device() && t.scalar_type() == first->scalar_type() &&
             t.dim() == first->dim();
      for (int64_t d = 0; lean && d < t.dim(); ++d) lean = d == dim || t.size(d) == first->size(d);
    }
    if (!lean) break;
    numel += t.numel();
    cat_size += t.size(dim);
  }
  // (Large ones get ATen's kernel, which copies on every intra-op thread.)
  if (!first || !lean || numel >= min_fusable_numel()) {
    c10::List<at::Tensor> list;
    for (const at::Tensor& t : tensors) list.push_back(t);
    return op.boxed(list, dim);
  }
  std::vector<int64_t> sizes = first->sizes().vec();
  sizes[dim] = cat_size;
  at::Tensor out = empty_contiguous(sizes, first->scalar_type());
  int64_t rows = 1;
  for (int64_t d = 0; d < dim; ++d) rows *= sizes[d];
  CatTask task{out.data_ptr(), rows, {}};
  for (const at::Tensor& t : tensors)
    task.inputs.emplace_back(t.const_data_ptr(), rows == 0 ? 0 : t.numel() / rows * static_cast<int64_t>(t.itemsize()));
  op.queue(first->device().index(), std::move(task));
  return out;
}

// Each takes the lean path only for dtypes whose result keeps their dtype and
// raises nothing: sub and relu refuse bool (sub a bool number too), div
// promotes integers to float.
at::Tensor add_tensor(const at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha) {
  static const Op op("aten::add", "Tensor");
  constexpr LeanKernel kernel = [](at::Tensor& o, const at::Tensor& a, const at::Tensor& b) { at::cpu::add_out(o, a, b); };
  if (is_one(alpha) && lean_operands(self, other)) return launch(op, kernel, self, other);
  if (is_one(alpha) && lean_with_number(self, other)) return launch_with_number(op, kernel, self, other);
  return op.boxed(self, other, alpha);
}

at::Tensor sub_tensor(const at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha) {
  static const Op op("aten::sub", "Tensor");
  constexpr LeanKernel kernel = [](at::Tensor& o, const at::Tensor& a, const at::Tensor& b) { at::cpu::sub_out(o, a, b); };
  if (is_one(alpha) && self.scalar_type() != at::kBool && other.scalar_type() != at::kBool) {
    if (lean_operands(self, other)) return launch(op, kernel, self, other);
    if (lean_with_number(self, other)) return launch_with_number(op, kernel, self, other);
  }
  return op.boxed(self, other, alpha);
}

at::Tensor mul_tensor(const at::Tensor& self, const at::Tensor& other) {
  static const Op op("aten::mul", "Tensor");
  constexpr LeanKernel kernel = [](at::Tensor& o, const at::Tensor& a, const at::Tensor& b) { at::cpu::mul_out(o, a, b); };
  if (lean_operands(self, other)) return launch(op, kernel, self, other);
  if (lean_with_number(self, other)) return launch_with_number(op, kernel, self, other);
  return op.boxed(self, other);
}

at::Tensor div_tensor(const at::Tensor& self, const at::Tensor& other) {
  static const Op op("aten::div", "Tensor");
  constexpr LeanKernel kernel = [](at::Tensor& o, const at::Tensor& a, const at::Tensor& b) { at::cpu::div_out(o, a, b); };
  if (at::isFloatingType(self.scalar_type())) {
    if (lean_operands(self, other)) return launch(op, kernel, self, other);
    if (lean_with_number(self, other)) return launch_with_number(op, kernel, self, other);
  }
  return op.boxed(self, other);
}

// ATen's CPU relu is clamp_min(self, 0) once it has refused bool (and clamp_min
// refuses complex).
at::Tensor relu(const at::Tensor& self) {
  static const Op op("aten::relu", "");
  if (lean_operands(self) && self.scalar_type() != at::kBool && !self.is_complex())
    return launch(op, [](at::Tensor& o, const at::Tensor& a, const at::Tensor&) { at::cpu::clamp_min_out(o, a, 0); },
                  self);
  return op.boxed(self);
}

// Floating dtypes only: the sum of integers and bools is an int64.
at::Tensor sum(const at::Tensor& self, std::optional<at::ScalarType> dtype) {
  static const Op op("aten::sum", "");
  if (lean_operands(self) && at::isFloatingType(self.scalar_type()) && (!dtype || *dtype == self.scalar_type()))
    return launch(op, [](at::Tensor& o, const at::Tensor& a, const at::Tensor&) { at::cpu::sum_out(o, a, {}); },
                  self, {}, /*reduces=*/true);
  return op.boxed(self, dtype);
}

} // namespace torchneuron::ops
