// Growing or shrinking a device storage in stream order (used by resize_,
// set_ and Python's storage.resize_()).
#pragma once

#include <c10/core/Storage.h>

namespace torchneuron {
void resize_storage_bytes(const c10::Storage& storage, size_t nbytes);
}
