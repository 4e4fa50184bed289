// The device's float32 tanh: its own function, as a NeuronCore's activation
// engine has its own, rather than the CPU's (MKL's VML, a library call).
//
// Why: written inline, fused chains compute it in registers while the chain
// streams its operands, where a library call is a stretch with no memory
// request in flight (benchmarks/RESULTS.md, the fused chains).
//
// Accuracy: faithfully rounded (under one ulp against tanh computed in
// double, over every float), as MKL's on the CPU is, so the two are the same
// float or neighbours (tests/test_device_tanh.py measures both;
// docs/numerics.md). NaN in gives the same NaN, quieted; tanh(-0) is -0.
//
// Every element is the same arithmetic, whatever its position or the length
// of the call, so any cut of the work (threads, fusion's slices, chains'
// chunks, a masked tail) gives the same bits: fused and unfused agree.
// Where: on every host, at every instruction-set level (isa.h), the same
// operations one for one (isa_avx512.cpp, isa_avx2.cpp, isa_portable.cpp),
// so the same bits wherever the device runs.
#pragma once

#include <cstdint>

namespace torchneuron::kernels {

// out[i] = tanh(x[i]) for i < n, on one thread; out may be x.
void tanh_float(float* out, const float* x, int64_t n);

} // namespace torchneuron::kernels
