// Launching one operator call on the device, once the executor has decided
// how (executor.h): queued behind the stream's work, with its results
// allocated now from the meta pass's prediction, or run synchronously after
// the stream drains. Either way the kernel runs on host views of device
// memory: no copies.
//
// A queued call hands its task a launch record: host values now, device
// tensors as plain metadata whose host views the task makes when it runs (so
// the host's per-operator path does not pay for them). Records are recycled,
// not freed, since the host allocates them and the executor releases them.
#pragma once

#include <ATen/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <vector>

namespace torchneuron {
namespace runtime {
class Stream;
}

struct OpPolicy;

// Queues `op` on the current stream of `device` with the results the meta
// pass predicted (`meta`; `meta_written`: its written arguments afterwards):
// the results' device memory is allocated now and they are returned on
// `stack` at once. Element-wise calls are offered to the fuser first.
void launch_queued(const c10::OperatorHandle& op, const OpPolicy& policy, torch::jit::Stack* stack,
                   c10::DeviceIndex device, const std::vector<c10::IValue>& meta,
                   const std::vector<at::Tensor>& meta_written);

// Waits for the stream, then runs `op` on `stack` in place: for operators
// whose output sizes are known only once they ran.
void run_synchronously(const c10::OperatorHandle& op, const OpPolicy& policy, torch::jit::Stack* stack,
                       c10::DeviceIndex device);

// Runs `op` on `stack` (host views) on this thread: the device's own kernel if
// it has one for these arguments, else ATen's CPU kernel. Every place that
// runs kernels on host views calls through here (queued tasks, fused groups'
// members, compiled replay), so an operator gives the same bits wherever and
// however it runs. `policy` is `op`'s or that of the operator `op` computes
// for (its functional form); without it, `op`'s is looked up.
void call_kernel(const c10::OperatorHandle& op, const OpPolicy& policy, torch::jit::Stack* stack);
void call_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack);

// Writes host tensor `src` into device tensor `dst` in `stream`'s order, as
// every host write into device memory must be: a block the allocator hands
// out may have been freed on the stream (by any thread) while queued work
// still reads it. Now, if the stream has nothing queued; otherwise as a task
// that holds `src` (a copy of it unless `owned`: the caller may reuse it).
void write_from_host(runtime::Stream& stream, const at::Tensor& dst, const at::Tensor& src, bool owned);
// Queues `dst.copy_(src)` (host tensors: views of device memory or host
// memory) on `stream`. The task holds both: a pinned buffer freed by the
// caller meanwhile stays out of the host allocator's cache until it ran.
void enqueue_copy(runtime::Stream& stream, at::Tensor dst, at::Tensor src);

// Makes device tensor `d` take the metadata `m` computed for it (an out=
// argument resized by the op, or an in-place metadata change).
void adopt_metadata(const at::Tensor& d, const at::Tensor& m);

} // namespace torchneuron
