// An emulated NeuronCore: its device memory, its streams and its error slot.
// The runtime owns one Device per visible core, for the life of the process.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "busy_time.h"
#include "config.h"
#include "errors.h"
#include "stream.h"
#include "task.h"

namespace torchneuron::runtime {

struct DeviceProperties {
  std::string name;    // "NeuronCore-v3 (emulated)": the machine model's core
  int cores_per_device = 0;  // logical NeuronCores per Trainium device: the machine's over the LNC
  int lnc = 1;         // physical NeuronCores this logical core groups (NEURON_LOGICAL_NC_CONFIG)
  int index = 0;       // index as PyTorch numbers devices
  int core_id = 0;     // logical core id from NEURON_RT_VISIBLE_CORES
  size_t total_memory = 0;
};

class Device {
 public:
  // Streams per device: 0 is the default stream, the rest a pool handed out
  // round-robin (as CUDA's stream pool); executors start on first use.
  static constexpr int kStreams = 32;

  Device(DeviceProperties props, bool launch_blocking);
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  int index() const { return props_.index; }
  const DeviceProperties& properties() const { return props_; }
  bool launch_blocking() const { return launch_blocking_; }

  // Device memory. `map` takes a segment of `bytes` (zero-filled, page
  // aligned) accounted against the capacity; over it is OutOfMemoryError.
  void* map(size_t bytes);
  void unmap(void* ptr);
  size_t mapped_bytes() const;
  size_t capacity() const { return props_.total_memory; }
  bool contains(const void* ptr) const;

  // Device memory another process maps (torch.multiprocessing). share()
  // moves the segment holding `ptr`, in place and with its contents, into a
  // shared memory object whose descriptor it returns (the device keeps it
  // open until unmap); the caller sees that no task uses the segment
  // meanwhile. map_shared() maps such a descriptor as a segment of this
  // device (counted against its capacity), for unmap to release.
  struct SharedSegment {
    int fd;
    void* base;
    size_t bytes;
  };
  SharedSegment share(const void* ptr);
  void* map_shared(int fd, size_t bytes);

  Stream& stream(int id);
  Stream* made_stream(int id) const { return made_[id].load(std::memory_order_acquire); }  // null: never used
  int next_pool_stream();  // an id from the pool, round-robin
  void synchronize();      // every stream, then raise a pending error
  // Waits for every stream until `deadline_ns`; whether all finished.
  bool wait_idle(int64_t deadline_ns);
  // Stream::cancel_pending on every stream; the number of tasks that had not
  // started (a snapshot per stream, taken just before its cancellation).
  size_t cancel_pending();

  // Asynchronous errors are sticky, as CUDA's: every failed task is kept (the
  // first kMaxKeptErrors, the rest counted), and every synchronising call
  // raises the first, naming how many followed, until take_errors() clears
  // them. A later task still runs; its results may depend on the failed one.
  static constexpr size_t kMaxKeptErrors = 64;
  void record_error(AsyncError error);
  void raise_pending_error();
  bool has_pending_error() const { return has_error_.load(std::memory_order_acquire); }
  struct Errors {
    std::vector<AsyncError> kept;
    size_t total = 0;       // kept and counted
    size_t unreported = 0;  // recorded since the last synchronising call raised
  };
  Errors errors() const;   // a copy
  Errors take_errors();    // and clears them: the device reports no error until the next failure

  // Time during which one of the device's streams runs a task (utilization()).
  BusyTime& busy_time() { return busy_time_; }

  void observe(int stream, const Task& task) const {
    if (TaskObserver obs = observer_.load(std::memory_order_acquire)) obs(index(), stream, task);
  }
  void set_observer(TaskObserver obs) { observer_.store(obs, std::memory_order_release); }
  bool observed() const { return observer_.load(std::memory_order_relaxed) != nullptr; }

 private:
  std::vector<Stream*> made_streams();  // streams made so far

  const DeviceProperties props_;
  const bool launch_blocking_;

  mutable std::mutex memory_mu_;
  std::map<uintptr_t, size_t> segments_;  // start -> size
  std::map<uintptr_t, int> shared_fds_;   // start -> its shared memory object, for shared segments
  size_t mapped_ = 0;

  std::mutex streams_mu_;
  std::array<std::unique_ptr<Stream>, kStreams> streams_;
  // The same streams, published once made: every operator and every free
  // looks its stream up, and a made stream lives as long as its device, so
  // the lookup needs no lock.
  std::array<std::atomic<Stream*>, kStreams> made_{};
  std::atomic<int> pool_cursor_{0};

  mutable std::mutex error_mu_;
  Errors errors_;
  std::atomic<bool> has_error_{false};
  std::atomic<TaskObserver> observer_{nullptr};
  BusyTime busy_time_;
};

// The process-wide runtime. device_count() never throws (0 when the
// configuration is invalid); init() raises the configuration error, or the
// fork error in a child forked after the parent's init(). device() calls init().
// in_bad_fork(): this process is such a child; the devices and their memory
// are the parent's, and frees of inherited memory are no-ops.
int device_count() noexcept;
void init();
bool in_bad_fork() noexcept;
Device& device(int index);
const Config& config();
// The configuration without initialising the runtime (a fork after it is no
// error); throws the ConfigError as init() does.
const Config& read_config();
void set_task_observer(TaskObserver observer);

} // namespace torchneuron::runtime
