#pragma once
//! Internal to backends/src: the helpers the Redis store's sources share (redis_layout.cpp defines them).
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include "tensordict/backends/redis_client.hpp"
#include "tensordict/backends/redis_store.hpp"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the Redis layout is little-endian; big-endian hosts need byte swaps");

namespace tensordict {
namespace backends {
namespace redis_detail {

inline int64_t item_size(at::ScalarType t) { return static_cast<int64_t>(c10::elementSize(t)); }

//! product of dims * itemsize, or -1 on overflow / beyond the Redis limit
int64_t checked_nbytes(const std::vector<int64_t>& shape, int64_t itemsize, size_t from = 0);

//! a tensor over the bytes of a reply (copied when small, the buffer kept when large)
at::Tensor tensor_from_bytes(std::string&& bytes, at::ScalarType dtype, at::IntArrayRef shape);

//! the fields of an HGETALL reply
std::map<std::string, std::string> hash_fields(const RedisReply& r);

//! a leaf path the layout can hold: not empty, no empty part, no '.' in a part (ValueError)
void check_leaf_path(const LeafPath& path);

inline std::vector<int64_t> std_shape(at::IntArrayRef s) { return std::vector<int64_t>(s.begin(), s.end()); }

inline std::string shape_str(const std::vector<int64_t>& s) { return redis_shape_text(s); }

}  // namespace redis_detail
}  // namespace backends
}  // namespace tensordict
