#pragma once
//! Internal to engine/: the one translation of libtorch's errors (c10::Error and its typed children, and the
//! std::runtime_error / std::out_of_range some ATen paths throw) into the tensordict error types.
//! Torch's messages are always taken without the C++ backtrace.
#include <string>

#include <c10/util/Exception.h>

#include "tensordict/errors.hpp"

namespace tensordict {
namespace detail {

//! how much of torch's message: as is, trailing blanks / newlines removed, or up to the first newline
enum class TorchText { Full, Trimmed, FirstLine };
std::string torch_message(const c10::Error& e, TorchText text = TorchText::Full);

//! c10::IndexError -> Index, c10::ValueError -> Value, c10::TypeError -> Type; any other c10::Error -> `other`
ErrorCode torch_error_code(const c10::Error& e, ErrorCode other = ErrorCode::Runtime);

//! throws the tensordict error of torch_error_code(e) with "context: " + torch's message (torch's message
//! alone when context is empty)
[[noreturn]] void rethrow_torch_error(const c10::Error& e, const std::string& context);

//! inside a catch block: rethrows the library's own errors and anything foreign unchanged; returns the
//! message of a torch error (c10::Error, trimmed; or the what() of a std::runtime_error / std::out_of_range
//! from an ATen path, e.g. view's shape check)
std::string current_torch_message();

}  // namespace detail
}  // namespace tensordict
