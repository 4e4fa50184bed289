#include "vector_math.h"

#include <ATen/Config.h>
#include <ATen/Version.h>  // get_cpu_capability: which of ATen's kernels run
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty.h>

#include <dlfcn.h>

#include <cmath>
#include <cstring>
#include <mutex>
#include <type_traits>

#include "isa.h"
#include "tanh.h"

namespace torchneuron::vector_math {

// MKL_INT is 32 or 64 bits by the interface; a 64-bit count serves both.
using VmlFloat = void (*)(int64_t n, const float* a, float* r, int64_t mode);
using VmlDouble = void (*)(int64_t n, const double* a, double* r, int64_t mode);

struct Unary {
  const char* op;
  const char* vml[2];  // MKL's names for float and double; none: sigmoid
  void (*own_float)(float* out, const float* x, int64_t n) = nullptr;  // the device's own
  VmlFloat vml_float = nullptr;
  VmlDouble vml_double = nullptr;
  bool matches[2] = {false, false};  // float, double: checked against ATen
};

namespace {

// The accuracy and error modes ATen's VML wrappers pass: high accuracy,
// denormals kept, errors ignored.
constexpr int64_t kVmlMode = 0x2 | 0x140000 | 0x100;

// Inputs that take every path: ordinary values over the ranges where the
// functions bend and saturate, and raw bit patterns (NaNs with payloads of
// both signs, infinities, subnormals, huge values).
at::Tensor probe_inputs(c10::ScalarType dtype, int64_t n) {
  at::Tensor x = at::empty({n}, at::TensorOptions().dtype(dtype));
  uint64_t state = 0x9e3779b97f4a7c15ull;
  for (int64_t i = 0; i < n; ++i) {
    state ^= state << 13, state ^= state >> 7, state ^= state << 17;
    const double ordinary = (int64_t(state % 20000001) - 10000000) * 1e-5;  // [-100, 100]
    if (dtype == at::kFloat) {
      float v = float(ordinary);
      if (i % 2 == 0) std::memcpy(&v, &state, sizeof v);
      x.data_ptr<float>()[i] = v;
    } else {
      double v = ordinary;
      if (i % 2 == 0) std::memcpy(&v, &state, sizeof v);
      x.data_ptr<double>()[i] = v;
    }
  }
  return x;
}

bool check(const Unary& fn, c10::ScalarType dtype) {
  const auto aten = c10::Dispatcher::singleton()
                        .findSchemaOrThrow((std::string("aten::") + fn.op).c_str(), "")
                        .typed<at::Tensor(const at::Tensor&)>();
  const at::Tensor x = probe_inputs(dtype, 4096 + 31);
  // Call lengths with each kind of remainder: none, one vector, a part of one.
  for (int64_t n : {4096, 4096 + 8, 4096 + 16, 4096 + 21, 4096 + 31}) {
    const at::Tensor in = x.narrow(0, 0, n);  // one call: below ATen's grain, on one thread
    // ATen's CPU kernel itself, whatever modes (autocast, Python) are active.
    const at::Tensor want = aten.redispatch(c10::DispatchKeySet(c10::DispatchKey::CPU), in);
    at::Tensor got = at::empty({n}, in.options());
    run(fn, dtype, static_cast<char*>(got.data_ptr()), static_cast<const char*>(in.data_ptr()), n);
    if (std::memcmp(got.data_ptr(), want.data_ptr(), want.nbytes()) != 0) return false;
  }
  return true;
}

// MKL is linked into libtorch_cpu, whose symbols may not be global.
void* mkl_library() {
  static void* const lib = [] {
    Dl_info info{};
    if (AT_MKL_ENABLED() && dladdr(reinterpret_cast<void*>(&at::get_cpu_capability), &info))
      return dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
    return static_cast<void*>(nullptr);
  }();
  return lib;
}

// MKL's C interface (by value); returns the thread's previous setting.
using SetLocalThreads = int (*)(int);
SetLocalThreads set_local_threads() {
  static const auto fn =
      mkl_library() ? reinterpret_cast<SetLocalThreads>(dlsym(mkl_library(), "MKL_Set_Num_Threads_Local")) : nullptr;
  return fn;
}

// What ATen hands to VML (its vml.h), as far as MKL has the function.
Unary* table_checked_once(size_t* size) {
  static Unary table[] = {
      {"sigmoid", {nullptr, nullptr}}, {"tanh", {"vmsTanh", "vmdTanh"}},   {"exp", {"vmsExp", "vmdExp"}},
      {"log", {"vmsLn", "vmdLn"}},     {"log2", {"vmsLog2", "vmdLog2"}},   {"log10", {"vmsLog10", "vmdLog10"}},
      {"sqrt", {"vmsSqrt", "vmdSqrt"}}, {"sin", {"vmsSin", "vmdSin"}},     {"cos", {"vmsCos", "vmdCos"}},
      {"tan", {"vmsTan", "vmdTan"}},   {"asin", {"vmsAsin", "vmdAsin"}},   {"acos", {"vmsAcos", "vmdAcos"}},
      {"atan", {"vmsAtan", "vmdAtan"}}, {"erf", {"vmsErf", "vmdErf"}},     {"erfc", {"vmsErfc", "vmdErfc"}}};
  static std::once_flag once;
  std::call_once(once, [] {
    void* lib = mkl_library();
    for (Unary& fn : table) {
      if (fn.vml[0] && lib) {
        fn.vml_float = reinterpret_cast<VmlFloat>(dlsym(lib, fn.vml[0]));
        fn.vml_double = reinterpret_cast<VmlDouble>(dlsym(lib, fn.vml[1]));
      }
      const bool sigmoid = !fn.vml[0];
      if (std::strcmp(fn.op, "tanh") == 0 && kernels::device_tanh_selected()) {
        fn.own_float = kernels::tanh_float;  // what the unfused kernel computes: no check against ATen
        fn.matches[0] = true;
        fn.matches[1] = fn.vml_double != nullptr && check(fn, at::kDouble);
        continue;
      }
      const isa::Kernels& k = isa::kernels();
      fn.matches[0] = (sigmoid ? k.sigmoid_ready(false) : fn.vml_float != nullptr) && check(fn, at::kFloat);
      fn.matches[1] = (sigmoid ? k.sigmoid_ready(true) : fn.vml_double != nullptr) && check(fn, at::kDouble);
    }
  });
  *size = std::size(table);
  return table;
}

} // namespace

const Unary* as_unfused(const std::string& op, c10::ScalarType dtype) {
  if (dtype != at::kFloat && dtype != at::kDouble) return nullptr;
  size_t size = 0;
  Unary* table = table_checked_once(&size);
  for (size_t i = 0; i < size; ++i)
    if (op == table[i].op) return table[i].matches[dtype == at::kDouble] ? &table[i] : nullptr;
  return nullptr;
}

bool is_sigmoid(const Unary& fn) { return !fn.vml[0]; }

bool is_own_tanh(const Unary& fn, c10::ScalarType dtype) { return dtype == at::kFloat && fn.own_float; }

int set_mkl_threads_of_this_thread(int n) {
  SetLocalThreads set = set_local_threads();
  return set ? set(n) : -1;
}

MklOnThisThread::MklOnThisThread() : previous_(set_mkl_threads_of_this_thread(1)) {}

MklOnThisThread::~MklOnThisThread() {
  if (previous_ >= 0) set_mkl_threads_of_this_thread(previous_);
}

void run(const Unary& fn, c10::ScalarType dtype, char* out, const char* x, int64_t n) {
  if (dtype == at::kFloat) {
    auto* o = reinterpret_cast<float*>(out);
    auto* a = reinterpret_cast<const float*>(x);
    fn.own_float ? fn.own_float(o, a, n) : fn.vml_float ? fn.vml_float(n, a, o, kVmlMode) : isa::kernels().sigmoid_float(o, a, n);
  } else {
    auto* o = reinterpret_cast<double*>(out);
    auto* a = reinterpret_cast<const double*>(x);
    fn.vml_double ? fn.vml_double(n, a, o, kVmlMode) : isa::kernels().sigmoid_double(o, a, n);
  }
}

} // namespace torchneuron::vector_math
