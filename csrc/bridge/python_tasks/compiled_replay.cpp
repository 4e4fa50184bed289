// See compiled_replay.h. Recorded once (Python builds the steps from what it
// saw during the recording call), replayed by one device task per call.
#include "compiled_replay.h"

#include <algorithm>
#include <utility>

#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>

#include "../device_state.h"
#include "../exec/host_views.h"
#include "../exec/launch.h"
#include "../exec/thread_count.h"
#include "../sanitizers/op_tracking.h"

namespace torchneuron {
namespace {

// A CPU tensor over `base`'s storage with the geometry of `ref` (same storage:
// ATen's overlap checks between arguments still see the aliasing).
at::Tensor view_of(const at::Tensor& base, const ReplayRef& ref) {
  const auto item = static_cast<int64_t>(c10::elementSize(ref.dtype));
  const int64_t byte_offset = base.storage_offset() * static_cast<int64_t>(base.element_size()) + ref.rel;
  TORCH_CHECK(byte_offset % item == 0, "compiled replay: argument at byte offset ", byte_offset,
              " is not aligned to its dtype ", ref.dtype);
  auto out = at::detail::make_tensor<c10::TensorImpl>(c10::Storage(base.storage()),
                                                      c10::DispatchKeySet(c10::DispatchKey::CPU),
                                                      c10::scalarTypeToTypeMeta(ref.dtype));
  out.unsafeGetTensorImpl()->set_sizes_and_strides(ref.sizes, ref.strides, byte_offset / item);
  return out;
}

} // namespace

struct CompiledReplay::Program {
  enum class Kind { Kernel, Op, Python };
  struct DynRef {   // a tensor argument that changes per call
    int64_t arg, elem;
    ReplayRef ref;
  };
  struct Copy {
    int64_t ret, elem;
    bool is_static;
    at::Tensor target;   // static: the CPU alias, built once
    ReplayRef ref;       // dynamic: resolved per call
  };
  struct Step {
    Kind kind;
    std::string name;
    // Kernel: entry point, arguments, (position, dynamic slot, byte offset),
    // and (position, constant host scalar)
    int64_t fn = 0;
    KernelArgs args;
    std::vector<std::tuple<int64_t, int64_t, int64_t>> ptr_patches;
    std::vector<std::pair<int64_t, HostScalar>> scalars;
    // Op: the operator, its argument stack with the static tensors in place
    std::optional<c10::OperatorHandle> op;
    c10::Stack stack;
    std::vector<DynRef> dyn_refs;
    std::vector<int64_t> dyn_lists;   // list arguments with dynamic elements (copied per call)
    std::vector<Copy> copies;
    PythonStep python;
  };

  std::string name;
  c10::DeviceIndex device;
  c10::Stream stream;
  std::vector<at::Tensor> statics;        // owned device memory (buffers, constants)
  std::vector<at::Tensor> static_hosts;   // their CPU aliases
  std::vector<Output> outputs;
  std::vector<ReplayRef> results;
  std::vector<Step> steps;
  bool needs_hosts = false;   // some step takes CPU aliases of the dynamic slots
  bool launched = false;

  at::Tensor static_view(const ReplayRef& ref) const {
    TORCH_CHECK(ref.slot >= 0 && ref.slot < int64_t(static_hosts.size()), "compiled replay: static slot ",
                ref.slot, " out of range");
    return view_of(static_hosts[ref.slot], ref);
  }

  void run_step(Step& s, const std::vector<int64_t>& ptrs, const std::vector<at::Tensor>& hosts,
                std::vector<int64_t>& scratch) const {
    switch (s.kind) {
      case Kind::Kernel: {
        scratch.assign(s.args.ints.begin(), s.args.ints.end());
        for (const auto& [pos, slot, rel] : s.ptr_patches) scratch[pos] = ptrs[slot] + rel;
        for (const auto& [pos, v] : s.scalars) scratch[pos] = v.address();
        call_cpp_kernel(s.fn, scratch, s.args.floats);
        return;
      }
      case Kind::Op: {
        c10::Stack stack = s.stack;   // IValue copies: tensors by reference count
        for (int64_t arg : s.dyn_lists) stack[arg] = c10::IValue(stack[arg].toList().copy());
        for (const auto& d : s.dyn_refs) {
          c10::IValue v(view_of(hosts[d.ref.slot], d.ref));
          if (d.elem < 0) {
            stack[d.arg] = std::move(v);
          } else {
            auto list = stack[d.arg].toList();
            list.set(d.elem, std::move(v));
          }
        }
        call_kernel(*s.op, &stack);
        for (const auto& c : s.copies) {
          const c10::IValue& r = stack.at(c.ret);
          at::Tensor src = c.elem < 0 ? r.toTensor() : r.toList().get(c.elem).toTensor();
          (c.is_static ? c.target : view_of(hosts[c.ref.slot], c.ref)).copy_(src);
        }
        return;
      }
      case Kind::Python:
        s.python(hosts, static_hosts);
        return;
    }
  }

  // The task: every step in order, on the executor thread. `scalars`: the
  // values of the 0-dim CPU inputs (dynamic slot, copy), which the kernels
  // read through `ptrs`.
  void run(std::vector<int64_t>& ptrs, const std::vector<at::Tensor>& hosts,
           const std::vector<std::pair<int64_t, HostScalar>>& scalars) {
    for (const auto& [slot, v] : scalars) ptrs[slot] = v.address();
    auto below = below_autograd();
    follow_host_thread_count();
    std::vector<int64_t> scratch;
    for (size_t i = 0; i < steps.size(); ++i) {
      try {
        run_step(steps[i], ptrs, hosts, scratch);
      } catch (const std::exception& e) {
        TORCH_CHECK(false, name, ": step ", i, " (", steps[i].name, ") failed: ", e.what());
      }
    }
  }
};

CompiledReplay::CompiledReplay(std::string name, c10::DeviceIndex device, std::vector<at::Tensor> statics,
                               std::vector<Output> outputs)
    : program_(std::make_shared<Program>(Program{std::move(name), device, current_stream(device)})) {
  auto& p = *program_;
  for (const auto& t : statics) {
    TORCH_CHECK(t.device().type() == kNeuron, p.name, ": static slots must be neuron tensors, got ", t.device());
    p.static_hosts.push_back(host_view(t));   // metadata only: read by the task, never here
  }
  p.statics = std::move(statics);
  p.outputs = std::move(outputs);
}

void CompiledReplay::add_kernel(std::string name, int64_t fn, KernelArgs args,
                                std::vector<std::pair<int64_t, ReplayRef>> patches,
                                const std::vector<std::pair<int64_t, at::Tensor>>& scalars) {
  auto& p = *program_;
  TORCH_CHECK(!p.launched, p.name, ": steps are added before the first replay");
  TORCH_CHECK(fn != 0, p.name, ": kernel ", name, " has no entry point");
  TORCH_CHECK(args.floats.size() <= kMaxKernelFloats, p.name, ": kernel ", name, " has ", args.floats.size(),
              " float arguments, at most ", kMaxKernelFloats, " supported");
  Program::Step s{Program::Kind::Kernel, std::move(name)};
  s.fn = fn;
  s.args = std::move(args);
  const auto check_pos = [&](int64_t pos) {
    TORCH_CHECK(pos >= 0 && pos < int64_t(s.args.ints.size()), p.name, ": kernel argument ", pos, " out of range");
  };
  for (auto& [pos, ref] : patches) {
    check_pos(pos);
    if (ref.is_static) {   // device memory is host-addressable: the pointer is fixed for good
      s.args.ints[pos] = reinterpret_cast<int64_t>(p.statics.at(ref.slot).data_ptr()) + ref.rel;
    } else {
      s.ptr_patches.emplace_back(pos, ref.slot, ref.rel);
    }
  }
  for (const auto& [pos, t] : scalars) {
    check_pos(pos);
    s.scalars.emplace_back(pos, HostScalar(t));
  }
  p.steps.push_back(std::move(s));
}

void CompiledReplay::add_op(std::string name, const c10::OperatorHandle& op, c10::Stack stack,
                            std::vector<ArgRef> refs, std::vector<CopyRef> copies) {
  auto& p = *program_;
  TORCH_CHECK(!p.launched, p.name, ": steps are added before the first replay");
  Program::Step s{Program::Kind::Op, std::move(name)};
  s.op = op;
  s.stack = std::move(stack);
  for (auto& r : refs) {
    TORCH_CHECK(r.arg >= 0 && r.arg < int64_t(s.stack.size()), p.name, ": ", s.name, ": argument ", r.arg,
                " out of range");
    if (!r.ref.is_static) {
      p.needs_hosts = true;
      if (r.elem >= 0 && std::find(s.dyn_lists.begin(), s.dyn_lists.end(), r.arg) == s.dyn_lists.end())
        s.dyn_lists.push_back(r.arg);
      s.dyn_refs.push_back({r.arg, r.elem, std::move(r.ref)});
    } else if (r.elem < 0) {
      s.stack[r.arg] = p.static_view(r.ref);
    } else {
      s.stack[r.arg].toList().set(r.elem, p.static_view(r.ref));
    }
  }
  for (auto& c : copies) {
    p.needs_hosts |= !c.ref.is_static;
    s.copies.push_back({c.ret, c.elem, c.ref.is_static, c.ref.is_static ? p.static_view(c.ref) : at::Tensor(),
                        std::move(c.ref)});
  }
  p.steps.push_back(std::move(s));
}

void CompiledReplay::add_python(std::string name, PythonStep fn) {
  auto& p = *program_;
  TORCH_CHECK(!p.launched, p.name, ": steps are added before the first replay");
  Program::Step s{Program::Kind::Python, std::move(name)};
  s.python = std::move(fn);
  p.needs_hosts = true;
  p.steps.push_back(std::move(s));
}

size_t CompiledReplay::num_steps() const { return program_->steps.size(); }

void CompiledReplay::set_results(std::vector<ReplayRef> results) {
  auto& p = *program_;
  for (const auto& r : results) {   // (dynamic slots are checked per call)
    TORCH_CHECK(r.slot >= 0 && (!r.is_static || r.slot < int64_t(p.statics.size())), p.name, ": result slot ",
                r.slot, " out of range");
  }
  p.results = std::move(results);
}

std::optional<std::vector<at::Tensor>> CompiledReplay::launch(const std::vector<at::Tensor>& inputs,
                                                              const std::vector<at::Tensor>& cpu_inputs) {
  auto& p = *program_;
  if (current_stream(p.device) != p.stream) return std::nullopt;
  p.launched = true;
  c10::DeviceGuard guard(c10::Device(kNeuron, p.device));
  std::vector<at::Tensor> outs;
  outs.reserve(p.outputs.size());
  const auto options = at::TensorOptions().device(kNeuron, p.device);
  for (const auto& o : p.outputs) outs.push_back(at::empty_strided(o.sizes, o.strides, options.dtype(o.dtype)));

  // Dynamic slots in the recorded order: neuron inputs, outputs, CPU inputs.
  // The task gets their addresses and CPU aliases, never the device tensors:
  // memory the host frees meanwhile is reused only by later work of this
  // stream (the caching allocator's stream order), as for any operator.
  const size_t n = inputs.size() + outs.size() + cpu_inputs.size();
  std::vector<int64_t> ptrs;
  std::vector<at::Tensor> hosts;
  ptrs.reserve(n);
  if (p.needs_hosts) hosts.reserve(n);
  for (const std::vector<at::Tensor>* group : {&inputs, static_cast<const std::vector<at::Tensor>*>(&outs)}) {
    for (const auto& t : *group) {
      TORCH_CHECK(t.device() == c10::Device(kNeuron, p.device), p.name, ": expected tensors on neuron:",
                  int(p.device), ", got ", t.device());
      ptrs.push_back(reinterpret_cast<int64_t>(t.data_ptr()));
      if (p.needs_hosts) hosts.push_back(host_view(t));
    }
  }
  std::vector<std::pair<int64_t, HostScalar>> scalars;
  for (const auto& t : cpu_inputs) {
    TORCH_CHECK(t.is_cpu(), p.name, ": expected CPU inputs, got ", t.device());
    if (t.dim() == 0) scalars.emplace_back(ptrs.size(), HostScalar(t));   // the address is set by the task
    ptrs.push_back(reinterpret_cast<int64_t>(t.data_ptr()));
    if (p.needs_hosts) hosts.push_back(t);   // host memory: kept alive by the task
  }
  record_execution(c10::OperatorName(p.name, ""), Execution::Queued);
  translate_errors([&] {
    current_runtime_stream(p.device).enqueue(
        p.name, [prog = program_, ptrs = std::move(ptrs), hosts = std::move(hosts), scalars = std::move(scalars)]()
                    mutable { prog->run(ptrs, hosts, scalars); });
  });

  std::vector<at::Tensor> results;
  results.reserve(p.results.size());
  for (const auto& r : p.results) {
    const size_t k = static_cast<size_t>(r.slot);
    TORCH_CHECK(r.is_static || k < inputs.size() + outs.size(), p.name, ": result slot ", k,
                " is not a neuron input or output");
    at::Tensor t = r.is_static ? p.statics[k] : k < inputs.size() ? inputs[k] : outs[k - inputs.size()];
    if (r.dtype != c10::ScalarType::Undefined) {   // a view into the slot
      if (r.dtype != t.scalar_type()) t = t.view(r.dtype);
      t = t.as_strided(r.sizes, r.strides, t.storage_offset() + r.rel / static_cast<int64_t>(t.element_size()));
    }
    results.push_back(std::move(t));
  }
  return results;
}

} // namespace torchneuron
