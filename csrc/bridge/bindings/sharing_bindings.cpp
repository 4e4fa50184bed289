// Device storages shared between processes (torch.multiprocessing): the
// sender's storage lives in a shared memory object, which the receiver maps
// as device memory of its own device of the same index. The pickling itself
// is torchneuron/sharing.py.
#include <torch/csrc/Storage.h>
#include <torch/csrc/utils/pybind.h>

#include "../device_state.h"
#include "bindings.h"

namespace py = pybind11;

namespace torchneuron {
namespace {

// The sender's half: (fd, segment bytes, storage offset in the segment).
// Synchronises the device first, so the receiver sees every queued write and
// no task uses the segment while it moves into shared memory.
py::tuple share_storage(const c10::Storage& storage) {
  const c10::Device device = storage.device();
  TORCH_CHECK(device.type() == kNeuron, "_share_neuron_storage: a ", device, " storage");
  TORCH_CHECK(storage.data(), "_share_neuron_storage: an empty storage has no memory to share");
  auto shared = translate_errors([&] {
    rt::Device& d = rt::device(device.index());
    d.synchronize();
    return d.share(storage.data());
  });
  const auto offset = static_cast<size_t>(static_cast<const char*>(storage.data()) - static_cast<char*>(shared.base));
  return py::make_tuple(shared.fd, shared.bytes, offset);
}

// The receiver's half: a storage of `nbytes` at `offset` in the mapped
// segment, which stays mapped while the storage lives.
c10::Storage storage_from_shared(int fd, size_t segment_bytes, size_t offset, size_t nbytes, int index) {
  check_device_index(index);
  TORCH_CHECK(offset + nbytes <= segment_bytes, "_neuron_storage_from_shared: ", nbytes, " bytes at ", offset,
              " do not fit a segment of ", segment_bytes);
  struct Mapping {
    int device;
    void* base;
  };
  void* base = translate_errors([&] { return rt::device(index).map_shared(fd, segment_bytes); });
  c10::DataPtr data(static_cast<char*>(base) + offset, new Mapping{index, base},
                    [](void* ctx) {
                      auto* m = static_cast<Mapping*>(ctx);
                      rt::device(m->device).unmap(m->base);
                      delete m;
                    },
                    c10::Device(kNeuron, static_cast<c10::DeviceIndex>(index)));
  return c10::Storage(c10::Storage::use_byte_size_t(), nbytes, std::move(data), nullptr, /*resizable=*/false);
}

} // namespace

void bind_sharing(py::module_& m) {
  m.def("_share_neuron_storage", [](py::handle storage) {
    TORCH_CHECK(THPStorage_Check(storage.ptr()), "_share_neuron_storage: expected a torch.UntypedStorage");
    return share_storage(THPStorage_Unpack(storage.ptr()));
  });
  m.def("_neuron_storage_from_shared", [](int fd, size_t segment_bytes, size_t offset, size_t nbytes, int index) {
    return py::reinterpret_steal<py::object>(
        THPStorage_Wrap(storage_from_shared(fd, segment_bytes, offset, nbytes, index)));
  });
}

} // namespace torchneuron
