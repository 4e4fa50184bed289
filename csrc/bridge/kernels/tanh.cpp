#include "tanh.h"

namespace torchneuron::kernels {

bool has_own_tanh() {
  static const bool yes = __builtin_cpu_supports("avx512f");
  return yes;
}

__attribute__((target("avx512f"))) void tanh_float(float* out, const float* x, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(out + i, tanh_float16(_mm512_loadu_ps(x + i)));
  if (i < n) {  // the tail: the same arithmetic on the lanes that exist
    const __mmask16 lanes = __mmask16((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(out + i, lanes, tanh_float16(_mm512_maskz_loadu_ps(lanes, x + i)));
  }
}

} // namespace torchneuron::kernels
