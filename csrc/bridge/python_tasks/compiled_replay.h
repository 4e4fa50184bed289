// mode="reduce-overhead" replay in C++: the device work recorded for one
// compiled graph (torchneuron/compile/replay.py) as a list of C++ steps that
// ONE device task runs in order, with no Python and no GIL on the executor
// thread (except for the rare step that needs a Python binding: a kernel with
// more float arguments than the C call path takes).
//
// Where a tensor argument lives is a `ReplayRef`: a dynamic slot (changes per
// call: the graph's neuron inputs, its fresh outputs, then its CPU inputs, in
// that order) or a static slot (buffers the graph allocated, kept for every
// replay, and neuron memory from outside the graph), plus a byte offset from
// the slot tensor's data pointer and the argument's geometry.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include "python_tasks.h"

namespace pybind11 {
class module_;
}

namespace torchneuron {

struct ReplayRef {
  bool is_static = false;
  int64_t slot = 0;       // index among the dynamic or the static slots
  int64_t rel = 0;        // byte offset from the slot tensor's data pointer
  std::vector<int64_t> sizes, strides;
  c10::ScalarType dtype = c10::ScalarType::Undefined;
};

class CompiledReplay {
 public:
  // Python step: called with the dynamic and the static slots' host aliases
  // (the GIL is taken by the callable itself).
  using PythonStep = std::function<void(const std::vector<at::Tensor>&, const std::vector<at::Tensor>&)>;
  struct Output {
    std::vector<int64_t> sizes, strides;
    c10::ScalarType dtype;
  };

  // Bound to the current stream of `device` at construction (the stream
  // the graph was recorded on).
  CompiledReplay(std::string name, c10::DeviceIndex device, std::vector<at::Tensor> statics,
                 std::vector<Output> outputs);

  // What the graph returns, in order: each a slot (the dynamic ones as
  // above, the outputs being the fresh tensors of the call), or a view of
  // one when `ref.dtype` is defined.
  void set_results(std::vector<ReplayRef> results);

  // A generated C++ kernel: entry point `fn` called with `args`, where the
  // integer-class arguments at `patches[i].first` become the data pointer of
  // `patches[i].second` and those at `scalars[i].first` a pointer to a copy
  // of `scalars[i].second` (a 0-dim CPU tensor, a constant of the graph).
  // A dynamic slot holding a 0-dim CPU input points to a copy of its value
  // taken at launch (python_tasks.h: HostScalar).
  void add_kernel(std::string name, int64_t fn, KernelArgs args, std::vector<std::pair<int64_t, ReplayRef>> patches,
                  const std::vector<std::pair<int64_t, at::Tensor>>& scalars);
  // An ATen operator called boxed with `stack` (its arguments, the tensors
  // among them left undefined), where argument `arg` (element `elem` of a
  // tensor list, or -1) is the CPU alias of `ref`. `copies`: returns
  // (return index, element or -1) that are new tensors, copied into `ref`.
  struct ArgRef {
    int64_t arg, elem;
    ReplayRef ref;
  };
  struct CopyRef {
    int64_t ret, elem;
    ReplayRef ref;
  };
  void add_op(std::string name, const c10::OperatorHandle& op, c10::Stack stack, std::vector<ArgRef> refs,
              std::vector<CopyRef> copies);
  void add_python(std::string name, PythonStep fn);

  // Queues the replay as one task on the current stream of the device with
  // `inputs` (neuron, used in place) and `cpu_inputs` (the outputs are
  // allocated fresh); returns the results (set_results). Returns nullopt,
  // queuing nothing, when the current stream is not the recorded one.
  std::optional<std::vector<at::Tensor>> launch(const std::vector<at::Tensor>& inputs,
                                                const std::vector<at::Tensor>& cpu_inputs);

  size_t num_steps() const;

  struct Program;

 private:
  std::shared_ptr<Program> program_;
};

} // namespace torchneuron
