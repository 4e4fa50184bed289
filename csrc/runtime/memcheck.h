// The device memory checker's runtime half (TORCHNEURON_MEMCHECK=1): host
// access protection of device memory with a memory protection key, the
// fault handler that turns a host access into a report, and the hooks around
// every task through which the bridge checks blocks (bridge/sanitizers/memcheck.h).
//
// Device segments carry one protection key whose access is disabled on every
// thread (x86 PKRU is per thread). Executor threads are the device and keep
// access; any other thread gets it only inside a DeviceAccess scope, which
// code that legitimately touches device memory on the calling thread opens
// (a write of PKRU, tens of cycles). A host access outside one faults
// (SEGV_PKUERR): the handler grants the faulting thread access in the
// interrupted context's saved PKRU (the kernel restores PKRU from the signal
// frame), so the instruction completes, and hands the fault to the bridge,
// which reports it. Other faults go to the previous handler.
//
// Off (the default), every hook is a test of one flag set at load time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "task.h"

namespace torchneuron::runtime::memcheck {

// Read from TORCHNEURON_MEMCHECK when the library loads; never changes.
// Static initializers of other files call enabled_at_load(), which does not
// depend on the order in which they run.
extern const bool g_enabled;
inline bool on() { return g_enabled; }
bool enabled_at_load();

// Whether host access protection works (memcheck on and a protection key
// allocated), and if not, why ("" while it does).
bool protecting();
const std::string& protection_off_reason();

// Gives device memory [p, p + n) (page aligned) the device's key.
void protect(void* p, size_t n);

// Code that touches device memory on a host thread runs inside one. Nests.
class DeviceAccess {
 public:
  DeviceAccess() {
    if (on()) enter();
  }
  ~DeviceAccess() {
    if (on()) leave();
  }
  DeviceAccess(const DeviceAccess&) = delete;
  DeviceAccess& operator=(const DeviceAccess&) = delete;

 private:
  static void enter();
  static void leave();
};

// Executor threads: access for the thread's life.
void grant_thread();
// Takes back access a fault granted this thread, unless a scope is open.
void revoke_fault_grant();

// A host access to device memory, as the handler saw it. Called inside the
// signal handler: it must not take locks that the faulting code may hold.
struct Fault {
  const void* addr;
  const void* ip;  // the faulting instruction
  bool write;
  int thread;      // system thread id
};
using FaultReporter = void (*)(const Fault&);
void set_fault_reporter(FaultReporter reporter);

// Called on the executor around each task that runs (not cancelled ones).
using TaskHook = void (*)(int device, int stream, const Task& task, bool finished);
void set_task_hook(TaskHook hook);
void task_hook(int device, int stream, const Task& task, bool finished);

// Called when a wait for task `seq` of a stream returned (Stream::wait_until),
// on the thread that waited: an executor running an event wait (the stream
// it runs follows that task) or a host (what it queues later follows it).
using WaitHook = void (*)(int device, int stream, uint64_t seq);
void set_wait_hook(WaitHook hook);
void wait_hook(int device, int stream, uint64_t seq);

// Called when task `seq` of `stream` counts as done and finishes task
// `waiter_seq` of stream `waiter` that ExternalEnd::then made wait for it (a
// stream's wait for a collective, ended on gloo's thread): before the waiting
// task can end, on whichever thread completed the first. The same order as an
// event wait the waiter's executor would run.
using FollowHook = void (*)(int device, int waiter, uint64_t waiter_seq, int stream, uint64_t seq);
void set_follow_hook(FollowHook hook);
void follow_hook(int device, int waiter, uint64_t waiter_seq, int stream, uint64_t seq);

} // namespace torchneuron::runtime::memcheck
