#include "device.h"
#include "memcheck.h"

#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <optional>
#include <utility>
#include <vector>

namespace torchneuron::runtime {

OutOfMemoryError::OutOfMemoryError(int device, size_t requested, size_t in_use, size_t capacity)
    : std::runtime_error(
          "neuron:" + std::to_string(device) + " is out of device memory: tried to allocate " +
          std::to_string(requested) + " bytes with " + std::to_string(in_use) + " of " +
          std::to_string(capacity) + " bytes in use (TORCHNEURON_HBM_BYTES sets the capacity)"),
      device(device), requested(requested), in_use(in_use), capacity(capacity) {}

AsyncError::AsyncError(int device, int stream, std::string task, std::string detail, std::exception_ptr cause,
                       size_t later_failures)
    : std::runtime_error("neuron:" + std::to_string(device) + ": operator " + task + " failed on the device (stream " +
                         std::to_string(stream) +
                         (later_failures ? "; " + std::to_string(later_failures) + " later task(s) failed too" : "") +
                         "): " + detail),
      device(device), stream(stream), task(std::move(task)), detail(std::move(detail)), cause(std::move(cause)) {}

Device::Device(DeviceProperties props, bool launch_blocking)
    : props_(std::move(props)), launch_blocking_(launch_blocking) {}

void* Device::map(size_t bytes) {
  {
    std::lock_guard<std::mutex> lock(memory_mu_);
    if (bytes > props_.total_memory - mapped_)
      throw OutOfMemoryError(index(), bytes, mapped_, props_.total_memory);
    mapped_ += bytes;  // reserve before mapping, so concurrent maps cannot overshoot
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  std::lock_guard<std::mutex> lock(memory_mu_);
  if (p == MAP_FAILED) {
    mapped_ -= bytes;
    throw OutOfMemoryError(index(), bytes, mapped_, props_.total_memory);
  }
  segments_.emplace(reinterpret_cast<uintptr_t>(p), bytes);
  memcheck::protect(p, bytes);
  return p;
}

void Device::unmap(void* ptr) {
  std::lock_guard<std::mutex> lock(memory_mu_);
  auto it = segments_.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == segments_.end()) throw UsageError("unmap of a pointer that is not a device segment");
  ::munmap(ptr, it->second);
  mapped_ -= it->second;
  segments_.erase(it);
  if (auto fd = shared_fds_.find(reinterpret_cast<uintptr_t>(ptr)); fd != shared_fds_.end()) {
    ::close(fd->second);
    shared_fds_.erase(fd);
  }
}

Device::SharedSegment Device::share(const void* ptr) {
  std::lock_guard<std::mutex> lock(memory_mu_);
  const auto p = reinterpret_cast<uintptr_t>(ptr);
  auto it = segments_.upper_bound(p);
  if (it == segments_.begin() || p >= std::prev(it)->first + std::prev(it)->second)
    throw UsageError("share of a pointer that is not device memory");
  --it;
  void* base = reinterpret_cast<void*>(it->first);
  const size_t bytes = it->second;
  if (auto fd = shared_fds_.find(it->first); fd != shared_fds_.end()) return {fd->second, base, bytes};
  auto fail = [&](const char* what) {
    throw UsageError(std::string("cannot share neuron device memory: ") + what + ": " + std::strerror(errno));
  };
  const int fd = ::memfd_create("neuron-device-segment", MFD_CLOEXEC);
  if (fd < 0) fail("memfd_create");
  void* staging = MAP_FAILED;
  if (::ftruncate(fd, static_cast<off_t>(bytes)) == 0)
    staging = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (staging == MAP_FAILED) {
    ::close(fd);
    fail("mapping a shared memory object");
  }
  {
    memcheck::DeviceAccess access;
    std::memcpy(staging, base, bytes);
  }
  ::munmap(staging, bytes);
  // The same addresses, now backed by the shared object: device tensors and
  // the allocator's blocks keep their pointers.
  if (::mmap(base, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED) {
    ::close(fd);
    fail("remapping the segment");
  }
  memcheck::protect(base, bytes);
  shared_fds_.emplace(it->first, fd);
  return {fd, base, bytes};
}

void* Device::map_shared(int fd, size_t bytes) {
  {
    std::lock_guard<std::mutex> lock(memory_mu_);
    if (mapped_ + bytes > props_.total_memory) throw OutOfMemoryError(index(), bytes, mapped_, props_.total_memory);
    mapped_ += bytes;
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  std::lock_guard<std::mutex> lock(memory_mu_);
  if (p == MAP_FAILED) {
    mapped_ -= bytes;
    throw UsageError(std::string("cannot map shared neuron device memory: ") + std::strerror(errno));
  }
  segments_.emplace(reinterpret_cast<uintptr_t>(p), bytes);
  memcheck::protect(p, bytes);
  return p;
}

size_t Device::mapped_bytes() const {
  std::lock_guard<std::mutex> lock(memory_mu_);
  return mapped_;
}

bool Device::contains(const void* ptr) const {
  auto p = reinterpret_cast<uintptr_t>(ptr);
  std::lock_guard<std::mutex> lock(memory_mu_);
  auto it = segments_.upper_bound(p);
  if (it == segments_.begin()) return false;
  --it;
  return p < it->first + it->second;
}

Stream& Device::stream(int id) {
  if (id < 0 || id >= kStreams)
    throw UsageError("stream id " + std::to_string(id) + " is out of range for neuron:" +
                     std::to_string(index()));
  if (Stream* made = made_[id].load(std::memory_order_acquire)) return *made;
  std::lock_guard<std::mutex> lock(streams_mu_);
  auto& s = streams_[id];
  if (!s) {
    s = std::make_unique<Stream>(*this, id);
    made_[id].store(s.get(), std::memory_order_release);
  }
  return *s;
}

int Device::next_pool_stream() {
  return 1 + pool_cursor_.fetch_add(1, std::memory_order_relaxed) % (kStreams - 1);
}

void Device::synchronize() {
  for (Stream* s : made_streams()) s->wait_until(s->last_enqueued());
  raise_pending_error();
}

std::vector<Stream*> Device::made_streams() {
  std::vector<Stream*> live;
  for (auto& s : made_)
    if (Stream* made = s.load(std::memory_order_acquire)) live.push_back(made);
  return live;
}

bool Device::wait_idle(int64_t deadline_ns) {
  for (Stream* s : made_streams())
    if (!s->wait_until(s->last_enqueued(), deadline_ns)) return false;
  return true;
}

size_t Device::cancel_pending() {
  size_t queued = 0;
  for (Stream* s : made_streams()) {
    queued += s->pending();
    s->cancel_pending();
  }
  return queued;
}

void Device::record_error(AsyncError error) {
  std::lock_guard<std::mutex> lock(error_mu_);
  if (errors_.kept.size() < kMaxKeptErrors) errors_.kept.push_back(std::move(error));
  ++errors_.total;
  ++errors_.unreported;
  has_error_.store(true, std::memory_order_release);
}

void Device::raise_pending_error() {
  if (!has_pending_error()) return;
  std::lock_guard<std::mutex> lock(error_mu_);
  if (errors_.kept.empty()) return;
  errors_.unreported = 0;
  const AsyncError& first = errors_.kept.front();
  if (errors_.total == 1) throw first;
  throw AsyncError(first.device, first.stream, first.task, first.detail, first.cause, errors_.total - 1);
}

Device::Errors Device::errors() const {
  std::lock_guard<std::mutex> lock(error_mu_);
  return errors_;
}

Device::Errors Device::take_errors() {
  std::lock_guard<std::mutex> lock(error_mu_);
  has_error_.store(false, std::memory_order_release);
  return std::exchange(errors_, Errors());
}

namespace {

struct Runtime {
  Config config;
  std::optional<ConfigError> config_error;
  std::vector<std::unique_ptr<Device>> devices;

  Runtime() {
    try {
      config = config_from_environment();
    } catch (const ConfigError& e) {
      config_error.emplace(e);
      return;
    }
    for (size_t i = 0; i < config.visible_cores.size(); ++i) {
      DeviceProperties p;
      p.name = config.machine.core_name + " (emulated)";
      p.cores_per_device = config.machine.cores_per_device / config.lnc;
      p.lnc = config.lnc;
      p.index = static_cast<int>(i);
      p.core_id = config.visible_cores[i];
      p.total_memory = config.hbm_bytes;
      devices.push_back(std::make_unique<Device>(p, config.launch_blocking));
    }
  }
};

std::atomic<bool> g_initialized{false};
std::atomic<bool> g_forked_child{false};

Runtime& the_runtime() {
  // Never destroyed: executor threads may still hold devices at exit.
  static Runtime* rt = [] {
    // A child forked after init() has none of the parent's executor threads,
    // and its device memory is a copy the parent owns: it must not touch the
    // devices. A child forked before init() (after device_count(), say) starts
    // them afresh, as a CUDA child of a parent that never initialised CUDA.
    pthread_atfork(nullptr, nullptr, [] {
      if (g_initialized.load()) g_forked_child.store(true);
    });
    return new Runtime();
  }();
  return *rt;
}

} // namespace

int device_count() noexcept { return static_cast<int>(the_runtime().devices.size()); }

bool in_bad_fork() noexcept { return g_forked_child.load(std::memory_order_relaxed); }

void init() {
  if (in_bad_fork())
    throw UsageError(
        "the neuron device cannot be used in a forked subprocess after the parent process "
        "initialised it; use the 'spawn' start method (multiprocessing.set_start_method('spawn'))");
  Runtime& rt = the_runtime();
  if (rt.config_error) throw *rt.config_error;
  if (!g_initialized.load(std::memory_order_relaxed)) g_initialized.store(true);
}

const Config& config() {
  init();
  return the_runtime().config;
}

const Config& read_config() {
  Runtime& rt = the_runtime();
  if (rt.config_error) throw *rt.config_error;
  return rt.config;
}

Device& device(int index) {
  init();
  auto& devices = the_runtime().devices;
  if (index < 0 || index >= static_cast<int>(devices.size()))
    throw UsageError("invalid neuron device index " + std::to_string(index) + ": " +
                     std::to_string(devices.size()) + " device(s) are visible (NEURON_RT_VISIBLE_CORES)");
  return *devices[index];
}

void set_task_observer(TaskObserver observer) {
  for (auto& d : the_runtime().devices) d->set_observer(observer);
}

} // namespace torchneuron::runtime
