// libtorch's errors -> the tensordict error types (see torch_errors.hpp).
#include "torch_errors.hpp"

#include <stdexcept>

namespace tensordict {
namespace detail {

std::string torch_message(const c10::Error& e, TorchText text) {
  std::string m = e.what_without_backtrace();
  if (text == TorchText::FirstLine) {
    auto nl = m.find('\n');
    if (nl != std::string::npos) m.resize(nl);
  } else if (text == TorchText::Trimmed) {
    while (!m.empty() && (m.back() == '\n' || m.back() == ' ')) m.pop_back();
  }
  return m;
}

ErrorCode torch_error_code(const c10::Error& e, ErrorCode other) {
  if (dynamic_cast<const c10::IndexError*>(&e)) return ErrorCode::Index;
  if (dynamic_cast<const c10::ValueError*>(&e)) return ErrorCode::Value;
  if (dynamic_cast<const c10::TypeError*>(&e)) return ErrorCode::Type;
  return other;
}

void rethrow_torch_error(const c10::Error& e, const std::string& context) {
  std::string msg = torch_message(e);
  if (!context.empty()) msg = context + ": " + msg;
  throw_error(torch_error_code(e), msg);
}

std::string current_torch_message() {
  try {
    throw;
  } catch (const Error&) {
    throw;
  } catch (const c10::Error& e) {
    return torch_message(e, TorchText::Trimmed);
  } catch (const std::runtime_error& e) {
    return e.what();
  } catch (const std::out_of_range& e) {
    return e.what();
  }
}

}  // namespace detail
}  // namespace tensordict
