// Host access protection and task hooks of the memory checker (memcheck.h).
#include "memcheck.h"

#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <mutex>

namespace torchneuron::runtime::memcheck {

bool enabled_at_load() {
  static const bool enabled = [] {
    const char* v = std::getenv("TORCHNEURON_MEMCHECK");
    return v && *v && std::strcmp(v, "0") != 0 && std::strcmp(v, "off") != 0;
  }();
  return enabled;
}
const bool g_enabled = enabled_at_load();

namespace {

int g_pkey = -1;
std::string g_off_reason;
std::atomic<FaultReporter> g_reporter{nullptr};
std::atomic<TaskHook> g_task_hook{nullptr};
std::atomic<WaitHook> g_wait_hook{nullptr};
std::atomic<FollowHook> g_follow_hook{nullptr};
struct sigaction g_previous;

thread_local int t_depth = 0;        // open DeviceAccess scopes
thread_local bool t_executor = false;

#if defined(__x86_64__)
// Memory protection keys are x86's PKRU here: the interrupted thread's PKRU
// sits in its signal frame's XSAVE area (standard format; offset from CPUID
// leaf 0xD, sub-leaf 9), where the handler grants our key back.
uint32_t g_pkru_offset = 0;
constexpr int kPkruComponent = 9;

uint32_t pkru_offset() {
  uint32_t eax, ebx, ecx, edx;
  __asm__ volatile("cpuid" : "=a"(eax), "=b"(ebx), "=c"(ecx), "=d"(edx) : "a"(0xd), "c"(kPkruComponent));
  return eax == 4 || eax == 8 ? ebx : 0;  // the component's size, then its offset
}

// Enables access and writes for our key in the interrupted context; false if
// its frame holds no PKRU. `pc` and `write`: the faulting instruction, and
// whether it wrote.
bool grant_in_frame(void* context, const void** pc, bool* write) {
  auto* uc = static_cast<ucontext_t*>(context);
  auto* xsave = reinterpret_cast<char*>(uc->uc_mcontext.fpregs);
  // The XSAVE header follows the 512-byte legacy area; PKRU is there only if its bit is set.
  if (!xsave || !(*reinterpret_cast<uint64_t*>(xsave + 512) >> kPkruComponent & 1)) return false;
  *reinterpret_cast<uint32_t*>(xsave + g_pkru_offset) &= ~(3u << (2 * g_pkey));
  *write = uc->uc_mcontext.gregs[REG_ERR] & 2;
  *pc = reinterpret_cast<const void*>(uc->uc_mcontext.gregs[REG_RIP]);
  return true;
}

const char* keys_missing() {
  g_pkru_offset = pkru_offset();
  return g_pkru_offset ? nullptr : "the CPU reports no PKRU state component (no memory protection keys)";
}
#else
bool grant_in_frame(void*, const void**, bool*) { return false; }
const char* keys_missing() { return "host access protection uses x86-64's memory protection keys"; }
#endif

void chain(int sig, siginfo_t* info, void* context) {
  if (g_previous.sa_flags & SA_SIGINFO) {
    if (g_previous.sa_sigaction) return g_previous.sa_sigaction(sig, info, context);
  } else if (g_previous.sa_handler != SIG_DFL && g_previous.sa_handler != SIG_IGN) {
    return g_previous.sa_handler(sig);
  }
  // Default action: restore it; the faulting instruction runs again and faults.
  signal(sig, SIG_DFL);
}

void on_segv(int sig, siginfo_t* info, void* context) {
#ifdef SEGV_PKUERR
  if (info->si_code == SEGV_PKUERR && info->si_pkey == static_cast<uint32_t>(g_pkey)) {
    const void* pc = nullptr;
    bool write = false;
    if (grant_in_frame(context, &pc, &write)) {
      if (FaultReporter report = g_reporter.load(std::memory_order_acquire))
        report(Fault{info->si_addr, pc, write, static_cast<int>(::syscall(SYS_gettid))});
      return;
    }
  }
#endif
  chain(sig, info, context);
}

// Ours comes first, chaining to the handler it replaced. Called again
// whenever a segment is mapped: a handler installed after ours (Python's
// faulthandler, which pytest enables after its conftest imported torch)
// would otherwise see a fault first and end the process.
std::mutex g_handler_mu;
bool install_handler() {
  std::lock_guard<std::mutex> lock(g_handler_mu);
  struct sigaction current {};
  if (sigaction(SIGSEGV, nullptr, &current) != 0) return false;
  if ((current.sa_flags & SA_SIGINFO) && current.sa_sigaction == on_segv) return true;
  struct sigaction sa {};
  sa.sa_sigaction = on_segv;
  sa.sa_flags = SA_SIGINFO | SA_NODEFER;
  sigemptyset(&sa.sa_mask);
  g_previous = current;
  return sigaction(SIGSEGV, &sa, nullptr) == 0;
}

bool start_protection() {
  if (const char* missing = keys_missing()) {
    g_off_reason = missing;
    return false;
  }
  // Allocated with access disabled for this thread; every other thread
  // starts with access to non-default keys disabled (the kernel's initial PKRU).
  g_pkey = pkey_alloc(0, PKEY_DISABLE_ACCESS);
  if (g_pkey < 0) {
    g_off_reason = std::string("pkey_alloc failed: ") + std::strerror(errno);
    return false;
  }
  if (!install_handler()) {
    g_off_reason = std::string("cannot install the SIGSEGV handler: ") + std::strerror(errno);
    pkey_free(g_pkey);
    g_pkey = -1;
    return false;
  }
  return true;
}

const bool g_protecting = enabled_at_load() && start_protection();

} // namespace

bool protecting() { return g_protecting; }
const std::string& protection_off_reason() { return g_off_reason; }

void protect(void* p, size_t n) {
  if (!g_protecting) return;
  install_handler();
  pkey_mprotect(p, n, PROT_READ | PROT_WRITE, g_pkey);
}

void DeviceAccess::enter() {
  if (g_protecting && t_depth++ == 0 && !t_executor) pkey_set(g_pkey, 0);
}

void DeviceAccess::leave() {
  if (g_protecting && --t_depth == 0 && !t_executor) pkey_set(g_pkey, PKEY_DISABLE_ACCESS);
}

void grant_thread() {
  t_executor = true;
  if (g_protecting) pkey_set(g_pkey, 0);
}

void revoke_fault_grant() {
  if (g_protecting && t_depth == 0 && !t_executor) pkey_set(g_pkey, PKEY_DISABLE_ACCESS);
}

void set_fault_reporter(FaultReporter reporter) { g_reporter.store(reporter, std::memory_order_release); }
void set_task_hook(TaskHook hook) { g_task_hook.store(hook, std::memory_order_release); }

void task_hook(int device, int stream, const Task& task, bool finished) {
  if (TaskHook hook = g_task_hook.load(std::memory_order_acquire)) hook(device, stream, task, finished);
}

void set_wait_hook(WaitHook hook) { g_wait_hook.store(hook, std::memory_order_release); }

void wait_hook(int device, int stream, uint64_t seq) {
  if (WaitHook hook = g_wait_hook.load(std::memory_order_acquire)) hook(device, stream, seq);
}

void set_follow_hook(FollowHook hook) { g_follow_hook.store(hook, std::memory_order_release); }

void follow_hook(int device, int waiter, uint64_t waiter_seq, int stream, uint64_t seq) {
  if (FollowHook hook = g_follow_hook.load(std::memory_order_acquire)) hook(device, waiter, waiter_seq, stream, seq);
}

} // namespace torchneuron::runtime::memcheck
