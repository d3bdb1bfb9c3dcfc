#pragma once
//! Devices named by text: a storage spec's or options' "device" field, a store's recorded device.
#include <string>

#include <c10/core/Device.h>

namespace tensordict {

//! the device `text` names ("cpu", "cuda:1", ...), available in this process. ValueError naming `what` when
//! the text is not a device, or when the device cannot hold a tensor here (a CUDA device on a CPU-only build
//! or machine): the error comes where the device is named, not at the first read.
at::Device parse_device(const std::string& text, const std::string& what);

}  // namespace tensordict
