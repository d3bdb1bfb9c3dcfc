#include "tensordict/device.hpp"

#include <optional>

#include <ATen/ATen.h>

#include "tensordict/errors.hpp"
#include "torch_errors.hpp"

namespace tensordict {

at::Device parse_device(const std::string& text, const std::string& what) {
  std::optional<at::Device> d;
  try {
    d.emplace(text);
  } catch (const c10::Error& e) {
    throw ValueError(what + ": '" + text + "' is not a device (" + detail::torch_message(e, detail::TorchText::FirstLine) + ")");
  }
  try {
    (void)at::empty({0}, at::TensorOptions().device(*d));
  } catch (const c10::Error& e) {
    throw ValueError(what + ": device '" + text + "' is not available in this process (" +
                     detail::torch_message(e, detail::TorchText::FirstLine) + ")");
  }
  return *d;
}

}  // namespace tensordict
