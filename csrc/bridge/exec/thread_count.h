// The intra-op thread count of the device's kernels. ATen keeps the count per
// thread (OpenMP's and MKL's settings of the calling thread), and a reduction
// splits its work, and so rounds, by it. Kernels on the device's threads
// (stream executors, autograd's device thread) therefore run with the count
// the host's CPU computations use: the count torch.set_num_threads last set,
// which the Python layer reports here (torchneuron/_torch_patches.py,
// "set-num-threads").
#pragma once

namespace torchneuron {

// Records the host's count (positive); every thread running kernels takes it
// at its next kernel.
void set_host_thread_count(int n);

// Gives the calling thread the host's count if it has another. Called before
// every kernel a device thread runs: one relaxed load when nothing changed.
void follow_host_thread_count();

} // namespace torchneuron
