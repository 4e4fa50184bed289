#include "process_group.h"

#include <ATen/core/ivalue.h>

#include <mutex>

#include "../device_state.h"
#include "../exec/host_views.h"

namespace torchneuron {
namespace {

// A collective's Work: gloo's, holding the device tensors it reads and
// writes through host views (which own no memory), with a future whose value
// is the device outputs, as a device backend's future has.
class NeuronWork final : public c10d::Work {
 public:
  NeuronWork(c10::intrusive_ptr<c10d::Work> inner, std::vector<at::Tensor> keep, std::vector<at::Tensor> outputs,
             c10::DeviceIndex device, c10d::OpType type)
      : c10d::Work(-1, type), inner_(std::move(inner)), keep_(std::move(keep)), outputs_(std::move(outputs)),
        device_(device) {}
  bool isCompleted() override { return inner_->isCompleted(); }
  bool isSuccess() const override { return inner_->isSuccess(); }
  std::exception_ptr exception() const override { return inner_->exception(); }
  int sourceRank() const override { return inner_->sourceRank(); }
  std::vector<at::Tensor> result() override { return outputs_; }
  bool wait(std::chrono::milliseconds timeout) override { return inner_->wait(timeout); }
  void synchronize() override { inner_->wait(); }
  void abort() override { inner_->abort(); }
  // Made on first use: gloo's point-to-point and barrier works have none.
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!future_) {
      future_ = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()),
                                                         std::vector<c10::Device>{c10::Device(kNeuron, device_)});
      inner_->getFuture()->addCallback([future = future_, outputs = outputs_](c10::ivalue::Future& done) {
        if (done.hasError()) future->setError(done.exception_ptr());
        else future->markCompleted(c10::IValue(outputs));
      });
    }
    return future_;
  }

 private:
  c10::intrusive_ptr<c10d::Work> inner_;
  std::vector<at::Tensor> keep_, outputs_;
  c10::DeviceIndex device_;
  std::mutex mu_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

// The tensors of one collective: checked to be on one neuron device, whose
// current stream has run the work queued before the call, and seen as host
// views for gloo.
struct Operands {
  c10::DeviceIndex device = -1;
  std::vector<at::Tensor> keep;

  at::Tensor view(const at::Tensor& t) {
    TORCH_CHECK(t.device().type() == kNeuron, "the neuron backend of torch.distributed takes neuron tensors, got a ",
                t.device(), " tensor; for CPU tensors initialise with backend=\"cpu:gloo,neuron:neuron\"");
    if (device < 0) {
      device = t.device().index();
      translate_errors([&] { current_runtime_stream(device).synchronize(); });
    }
    TORCH_CHECK(t.device().index() == device, "a collective's tensors must be on one neuron device, got neuron:",
                int(device), " and ", t.device());
    keep.push_back(t);
    return host_view(t);
  }
  std::vector<at::Tensor> view(const std::vector<at::Tensor>& ts) {
    std::vector<at::Tensor> out;
    for (const auto& t : ts) out.push_back(view(t));
    return out;
  }
  std::vector<std::vector<at::Tensor>> view(const std::vector<std::vector<at::Tensor>>& lists) {
    std::vector<std::vector<at::Tensor>> out;
    for (const auto& l : lists) out.push_back(view(l));
    return out;
  }
  c10::intrusive_ptr<c10d::Work> work(c10::intrusive_ptr<c10d::Work> inner, std::vector<at::Tensor> outputs,
                                      c10d::OpType type) {
    if (device < 0) device = current_device();
    return c10::make_intrusive<NeuronWork>(std::move(inner), std::move(keep), std::move(outputs), device, type);
  }
};

// PREMUL_SUM, which gloo refuses: the inputs multiplied by its factor, then
// SUM, as NCCL computes it. `in_place` collectives (all_reduce, reduce)
// scale their own tensors, whose values the result replaces; the others
// scale copies, leaving their inputs as they were.
template <class Options>
Options premultiplied(const Options& opts, std::vector<at::Tensor>& host_inputs, bool in_place) {
  if (opts.reduceOp != c10d::ReduceOp::PREMUL_SUM) return opts;
  auto* supplement = dynamic_cast<c10d::PreMulSumSupplement*>(opts.reduceOp.supplement_.get());
  TORCH_CHECK(supplement, "neuron: a PREMUL_SUM reduction without its factor");
  const at::Tensor& t = supplement->tensor_factor;
  const at::Tensor factor = t.defined() ? (t.device().type() == kNeuron ? host_view(t) : t)
                                        : at::scalar_tensor(supplement->double_factor, at::kDouble);
  for (auto& x : host_inputs) x = in_place ? x.mul_(factor) : x.mul(factor);
  Options sum = opts;
  sum.reduceOp = c10d::ReduceOp(c10d::ReduceOp::SUM);
  return sum;
}

std::vector<at::Tensor> flat(const std::vector<std::vector<at::Tensor>>& lists) {
  std::vector<at::Tensor> out;
  for (const auto& l : lists) out.insert(out.end(), l.begin(), l.end());
  return out;
}

} // namespace

NeuronBackend::NeuronBackend(c10::intrusive_ptr<c10d::Backend> gloo, int rank, int size)
    : c10d::Backend(rank, size), gloo_(std::move(gloo)) {}

// A subgroup (split_group, a device mesh's dimensions): gloo's split, wrapped.
c10::intrusive_ptr<c10d::Backend> NeuronBackend::split(const c10::intrusive_ptr<c10d::Store>& store,
                                                       const std::vector<int>& ranks,
                                                       const c10::intrusive_ptr<Options>& opts) {
  auto gloo = gloo_->split(store, ranks, opts);
  if (!gloo) return nullptr;  // this rank is not in `ranks`
  return c10::make_intrusive<NeuronBackend>(gloo, gloo->getRank(), gloo->getSize());
}

using c10d::OpType;
using c10d::Work;

c10::intrusive_ptr<Work> NeuronBackend::broadcast(std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& opts) {
  Operands o;
  auto views = o.view(tensors);
  return o.work(gloo_->broadcast(views, opts), tensors, OpType::BROADCAST);
}

c10::intrusive_ptr<Work> NeuronBackend::allreduce(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) {
  Operands o;
  auto views = o.view(tensors);
  const auto sum = premultiplied(opts, views, true);
  return o.work(gloo_->allreduce(views, sum), tensors, OpType::ALLREDUCE);
}

c10::intrusive_ptr<Work> NeuronBackend::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                          const c10d::AllreduceCoalescedOptions& opts) {
  Operands o;
  auto views = o.view(tensors);
  const auto sum = premultiplied(opts, views, true);
  return o.work(gloo_->allreduce_coalesced(views, sum), tensors, OpType::ALLREDUCE_COALESCED);
}

c10::intrusive_ptr<Work> NeuronBackend::reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) {
  Operands o;
  auto views = o.view(tensors);
  const auto sum = premultiplied(opts, views, true);
  return o.work(gloo_->reduce(views, sum), tensors, OpType::REDUCE);
}

c10::intrusive_ptr<Work> NeuronBackend::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions& opts) {
  Operands o;
  auto in = o.view(inputs);
  auto out = o.view(outputs);
  return o.work(gloo_->allgather(out, in, opts), flat(outputs), OpType::ALLGATHER);
}

c10::intrusive_ptr<Work> NeuronBackend::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::AllgatherOptions& opts) {
  Operands o;
  auto in = o.view(input);
  auto out = o.view(output);
  return o.work(gloo_->_allgather_base(out, in, opts), {output}, OpType::_ALLGATHER_BASE);
}

c10::intrusive_ptr<Work> NeuronBackend::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                      std::vector<at::Tensor>& inputs,
                                                                      const c10d::AllgatherOptions& opts) {
  Operands o;
  auto in = o.view(inputs);
  auto out = o.view(outputs);
  return o.work(gloo_->allgather_into_tensor_coalesced(out, in, opts), outputs, OpType::COALESCED);
}

c10::intrusive_ptr<Work> NeuronBackend::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                          std::vector<at::Tensor>& inputs,
                                                          const c10d::AllgatherOptions& opts) {
  Operands o;
  auto in = o.view(inputs);
  auto out = o.view(outputs);
  return o.work(gloo_->allgather_coalesced(out, in, opts), flat(outputs), OpType::ALLGATHER_COALESCED);
}

c10::intrusive_ptr<Work> NeuronBackend::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                             std::vector<at::Tensor>& inputs, const c10d::GatherOptions& opts) {
  Operands o;
  auto in = o.view(inputs);
  auto out = o.view(outputs);
  return o.work(gloo_->gather(out, in, opts), flat(outputs), OpType::GATHER);
}

c10::intrusive_ptr<Work> NeuronBackend::scatter(std::vector<at::Tensor>& outputs,
                                              std::vector<std::vector<at::Tensor>>& inputs,
                                              const c10d::ScatterOptions& opts) {
  Operands o;
  auto out = o.view(outputs);
  auto in = o.view(inputs);
  return o.work(gloo_->scatter(out, in, opts), outputs, OpType::SCATTER);
}

c10::intrusive_ptr<Work> NeuronBackend::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                     std::vector<std::vector<at::Tensor>>& inputs,
                                                     const c10d::ReduceScatterOptions& opts) {
  Operands o;
  auto out = o.view(outputs);
  auto in = o.view(inputs);
  std::vector<at::Tensor> scaled = flat(in);
  const auto sum = premultiplied(opts, scaled, false);
  if (sum.reduceOp != opts.reduceOp)
    for (size_t i = 0, k = 0; i < in.size(); ++i)
      for (auto& x : in[i]) x = scaled[k++];
  return o.work(gloo_->reduce_scatter(out, in, sum), outputs, OpType::REDUCE_SCATTER);
}

c10::intrusive_ptr<Work> NeuronBackend::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                           const c10d::ReduceScatterOptions& opts) {
  Operands o;
  auto out = o.view(output);
  std::vector<at::Tensor> in{o.view(input)};
  const auto sum = premultiplied(opts, in, false);
  return o.work(gloo_->_reduce_scatter_base(out, in[0], sum), {output}, OpType::_REDUCE_SCATTER_BASE);
}

c10::intrusive_ptr<Work> NeuronBackend::reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                      std::vector<at::Tensor>& inputs,
                                                                      const c10d::ReduceScatterOptions& opts) {
  Operands o;
  auto out = o.view(outputs);
  auto in = o.view(inputs);
  const auto sum = premultiplied(opts, in, false);
  return o.work(gloo_->reduce_scatter_tensor_coalesced(out, in, sum), outputs, OpType::COALESCED);
}

c10::intrusive_ptr<Work> NeuronBackend::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                    std::vector<int64_t>& output_splits,
                                                    std::vector<int64_t>& input_splits,
                                                    const c10d::AllToAllOptions& opts) {
  Operands o;
  auto out = o.view(output);
  auto in = o.view(input);
  return o.work(gloo_->alltoall_base(out, in, output_splits, input_splits, opts), {output}, OpType::ALLTOALL_BASE);
}

c10::intrusive_ptr<Work> NeuronBackend::alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                               const c10d::AllToAllOptions& opts) {
  Operands o;
  auto out = o.view(outputs);
  auto in = o.view(inputs);
  return o.work(gloo_->alltoall(out, in, opts), outputs, OpType::ALLTOALL);
}

c10::intrusive_ptr<Work> NeuronBackend::send(std::vector<at::Tensor>& tensors, int dst, int tag) {
  Operands o;
  auto views = o.view(tensors);
  return o.work(gloo_->send(views, dst, tag), {}, OpType::SEND);
}

c10::intrusive_ptr<Work> NeuronBackend::recv(std::vector<at::Tensor>& tensors, int src, int tag) {
  Operands o;
  auto views = o.view(tensors);
  return o.work(gloo_->recv(views, src, tag), tensors, OpType::RECV);
}

c10::intrusive_ptr<Work> NeuronBackend::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  Operands o;
  auto views = o.view(tensors);
  return o.work(gloo_->recvAnysource(views, tag), tensors, OpType::RECVANYSOURCE);
}

c10::intrusive_ptr<Work> NeuronBackend::barrier(const c10d::BarrierOptions& opts) {
  Operands o;
  return o.work(gloo_->barrier(opts), {}, OpType::BARRIER);
}

} // namespace torchneuron
