// torch.distributed's `neuron` backend: a c10d Backend that runs a gloo
// backend (made in Python, owned here) on host views of device memory, so a
// collective copies nothing.
//
// Streams, as NCCL has them: each group has a communication stream per device
// on which its collectives run, in the order the host issues them (the order
// gloo needs on every rank). A collective's task waits for an event of the
// caller's current stream, so it sees the work queued before it, and the host
// goes on at once; Work.wait() makes the caller's current stream wait for the
// task, not the host (barrier and a wait with a timeout wait on the host).
// When the caller's stream has nothing queued and every earlier call of the
// group has reached gloo, the host makes gloo's call itself, as with CPU
// tensors (gloo runs it on its own threads). Either way gloo's completion
// callback ends the task (runtime::ExternalEnd): a host waiting for the
// collective is woken by gloo's thread, as with CPU tensors, and no executor
// thread waits for gloo.
// The tensors are recorded on the communication stream (record_stream), so
// the allocator reuses none of them before the collective is done. Arguments
// are checked at the call, so bad ones raise there, not on the stream.
//
// Faults: a watchdog ends a collective gloo has not finished by the group's
// timeout and a grace; a failure (a dead peer, a timeout) is reported at once on stderr and
// becomes the device's error, raised by the next synchronising call of every
// surviving rank as DistBackendError naming the operation, the group, the
// rank and the elapsed time. PREMUL_SUM, which gloo refuses, is a pre-scale
// and SUM; subgroups split gloo's backend.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <unordered_map>

namespace torchneuron {

struct Operands;   // a collective's tensors, checked and seen as host views
struct CallState;  // what a collective's task and its Work share

class NeuronBackend final : public c10d::Backend {
 public:
  NeuronBackend(c10::intrusive_ptr<c10d::Backend> gloo, int rank, int size, std::chrono::milliseconds timeout);
  // A gloo call on host views, made on the communication stream or by the host (see above).
  using Launch = std::function<c10::intrusive_ptr<c10d::Work>(c10d::Backend& gloo)>;

  const std::string getBackendName() const override { return "neuron"; }
  bool supportsSplitting() const override { return gloo_->supportsSplitting(); }
  c10::intrusive_ptr<c10d::Backend> split(const c10::intrusive_ptr<c10d::Store>& store, const std::vector<int>& ranks,
                                          const c10::intrusive_ptr<Options>& opts) override;
  void setSequenceNumberForGroup() override { gloo_->setSequenceNumberForGroup(); }
  uint64_t getSequenceNumberForGroup() override { return gloo_->getSequenceNumberForGroup(); }
  void setTimeout(std::chrono::milliseconds timeout) override;
  // gloo's: split_group copies the parent's options into the split
  c10::intrusive_ptr<Options> getBackendOptions() override { return gloo_->getBackendOptions(); }
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) override;
  // _coalescing_manager(device=...): the collectives in between run as they
  // are issued, in order on the communication stream; the end's Work waits
  // for them all.
  bool supportsCoalescing() const override { return true; }  // batch_isend_irecv coalesces, as on NCCL
  void startCoalescing() override;
  c10::intrusive_ptr<c10d::Work> endCoalescing() override;

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                    const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                std::vector<at::Tensor>& inputs,
                                                                const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                    std::vector<at::Tensor>& inputs,
                                                    const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                       const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                                        const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                               std::vector<std::vector<at::Tensor>>& inputs,
                                               const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                     const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                std::vector<at::Tensor>& inputs,
                                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_splits,
                                              std::vector<int64_t>& input_splits,
                                              const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                         const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;

 private:
  c10::intrusive_ptr<c10d::Work> run(Operands& operands, const char* name, c10d::OpType type,
                                     std::vector<at::Tensor> outputs, std::chrono::milliseconds timeout,
                                     Launch launch);
  int comm_stream(c10::DeviceIndex device);  // its id, taken from the device's pool on first use

  c10::intrusive_ptr<c10d::Backend> gloo_;
  std::chrono::milliseconds timeout_;
  std::mutex streams_mu_;
  std::unordered_map<c10::DeviceIndex, int> comm_streams_;
  // Calls queued on a communication stream that have not made gloo's call
  // yet: while there are any, the host makes none itself (gloo's order).
  std::shared_ptr<std::atomic<int>> unissued_ = std::make_shared<std::atomic<int>>(0);
  // Sends and receives gloo has not finished, which hold their tensors though
  // their Works may be gone (an isend nobody waits for); pruned at each call.
  std::vector<std::shared_ptr<CallState>> p2p_in_flight_;
  bool coalescing_ = false;
  std::vector<c10::intrusive_ptr<c10d::Work>> coalesced_;
};

} // namespace torchneuron
