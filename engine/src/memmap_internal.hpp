#pragma once
//! Internal to engine/: what the memmap sources share (memmap.cpp defines them).
#include <cstddef>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>

#include "tensor_dict_internal.hpp"
#include "tensordict/backends/memmap_format.hpp"

namespace tensordict::detail::memmap {

// the format's names the memmap sources use (a `using namespace detail::memmap` brings them along)
using backends::DirEntry;
using backends::DirNode;
using backends::LeafMeta;
using backends::NodeKind;

inline std::string join_path(const std::string& dir, const std::string& name) {
  // dir + "/" + name, what std::filesystem's operator/ gives for a relative, non-empty name below a non-empty dir,
  // without building and splitting two paths (a third of a 200-leaf save's planning, callgrind)
  if (dir.empty() || name.empty() || name.front() == '/') return (std::filesystem::path(dir) / name).string();
  std::string out;
  out.reserve(dir.size() + 1 + name.size());
  out += dir;
  if (dir.back() != '/') out += '/';
  out += name;
  return out;
}

//! the meta.json record of tensor leaf `key` (its file: the encoded key + ".memmap"; none when empty)
LeafMeta leaf_meta(const std::string& key, const at::Tensor& t);

//! marks `impl` and the TensorDicts below it as memmap TensorDicts stored in `prefix` and its
//! subdirectories (members of lazy stacks in sub/0, sub/1, ...); "" for anonymous memory
void mark_memmap(const std::shared_ptr<TensorDictImpl>& impl, const std::string& prefix);

//! fn(i) for every i in [0, n): on the calling thread, or on min(num_threads, n) threads taking the next i in turn
//! when num_threads > 1 (the calling thread one of them); every i runs even after one throws, then the first
//! exception is rethrown
void for_each_job(size_t n, int64_t num_threads, const std::function<void(size_t)>& fn);

}  // namespace tensordict::detail::memmap
