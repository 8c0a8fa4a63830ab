// ReadManifest: see stoker/dataset.h.
#include <string>

#include "stoker/dataset.h"

namespace stoker {

Result<format::Manifest> ReadManifest(Store& store) {
  auto raw = store.ReadAll(format::kManifestKey);
  if (!raw.ok()) {
    if (raw.status().code() == Code::kNotFound) {
      return NotFound("no stoker dataset at " + store.uri() + " (no " +
                      std::string(format::kManifestKey) + ")");
    }
    return raw.status();
  }
  return format::DecodeManifest(*raw, store.uri() + "/" + std::string(format::kManifestKey));
}

}  // namespace stoker
