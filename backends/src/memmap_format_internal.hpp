#pragma once
//! Internal to backends/src: the helpers the memmap format's sources share (memmap_format.cpp defines them).
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace tensordict::backends::memmap_detail {

//! numel of a shape with overflow detection; nullopt on overflow.
std::optional<int64_t> checked_numel(const std::vector<int64_t>& shape);

//! `dir` + "/" + `name` (`name` alone when `dir` is empty)
std::string join(const std::string& dir, const std::string& name);

}  // namespace tensordict::backends::memmap_detail
