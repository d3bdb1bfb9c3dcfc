#pragma once
// Python pickles of plain data (dict with string keys, list, tuple, str, int, float, bool, None, bytes): what a
// Python rank's send_object_list / broadcast_object_list frames a tensordict's metadata record as. load_plain
// never executes anything: a pickle that names a class or calls a function is a FormatError.
#include <string>

#include "tensordict/backends/json_value.hpp"

namespace tensordict::pickle {

//! protocol 2 pickle of `value` (objects as dicts, arrays as lists, Bytes as bytes)
std::string dump_plain(const JsonValue& value);
//! the plain data in a pickle (protocols 2 to 5; tuples become arrays); FormatError otherwise
JsonValue load_plain(const std::string& bytes);

}  // namespace tensordict::pickle
