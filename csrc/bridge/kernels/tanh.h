// The device's own float32 tanh, a model of a NeuronCore's activation engine,
// which has its own functions. Off by default: float32 tanh on `neuron` is the
// CPU's (ATen's kernel unfused, the same MKL call in fusion), because exact
// CPU numerics is what the device promises and a one-ulp difference in tanh
// grows through recurrent layers and training. TORCHNEURON_DEVICE_TANH=1,
// read once at start-up, selects the device's own (docs/numerics.md).
//
// Accuracy: faithfully rounded (under one ulp against tanh computed in
// double, over every float), as MKL's on the CPU is, so the two are the same
// float or neighbours (tests/test_device_tanh.py measures both). NaN in gives
// the same NaN, quieted; tanh(-0) is -0.
//
// Every element is the same arithmetic, whatever its position or the length
// of the call, so any cut of the work (threads, fusion's slices, chains'
// chunks, a masked tail) gives the same bits: fused and unfused agree.
// Written inline, fused chains compute it in registers while the chain
// streams its operands. On every host, at every instruction-set level
// (isa.h), the same operations one for one (isa_avx512.cpp, isa_avx2.cpp,
// isa_portable.cpp), so the same bits wherever the device runs.
#pragma once

#include <cstdint>

namespace torchneuron::kernels {

// Whether float32 tanh is the device's own function: TORCHNEURON_DEVICE_TANH
// is 1 (unset, empty or 0: the CPU's). Read at the first call; any other
// value throws c10::ValueError naming the variable.
bool device_tanh_selected();

// out[i] = tanh(x[i]) for i < n, on one thread; out may be x.
void tanh_float(float* out, const float* x, int64_t n);

} // namespace torchneuron::kernels
