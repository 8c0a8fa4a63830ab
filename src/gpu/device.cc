// Device names, parsed without CUDA: "cuda:N" is checked here so that a
// typo is an InvalidArgument on every build, GPU or not.
#include <charconv>

#include "stoker/gpu.h"

namespace stoker {

Result<int> ParseDevice(std::string_view device) {
  if (device.empty() || device == "cpu") return -1;
  if (device == "cuda") return 0;  // as torch.device("cuda") means the first GPU
  constexpr std::string_view kPrefix = "cuda:";
  if (device.substr(0, kPrefix.size()) == kPrefix) {
    const std::string_view digits = device.substr(kPrefix.size());
    int index = -1;
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), index);
    if (ec == std::errc() && end == digits.data() + digits.size() && !digits.empty() &&
        index >= 0 && digits[0] != '+') {
      return index;
    }
  }
  return InvalidArgument("device '" + std::string(device) +
                         "' is not one of: \"\" or \"cpu\" (host memory), \"cuda\", \"cuda:N\"");
}

std::string DeviceName(int device) { return "cuda:" + std::to_string(device); }

}  // namespace stoker
