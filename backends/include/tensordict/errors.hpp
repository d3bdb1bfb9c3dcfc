#pragma once
//! The tensordict exception hierarchy: one base, typed children (libtorch's style: errors are exceptions).
//! One table (TENSORDICT_ERROR_TABLE) lists the codes, their Python-visible names and the typed classes.
#include <cstring>
#include <stdexcept>
#include <string>

namespace tensordict {

//! X(code, Name): ErrorCode::code, class Name, Python-visible name "Name". Append only: the code's number
//! crosses actors and processes (map errors, store replies).
#define TENSORDICT_ERROR_TABLE(X)                                                             \
  X(Key, KeyError)                     /* missing key, key of the wrong kind, key collisions */ \
  X(Index, IndexError)                 /* bad index on the batch dims */                        \
  X(Locked, LockedError)               /* structural change on a locked TensorDict */           \
  X(BatchSize, BatchSizeError)         /* leaf shapes that do not fit the batch size */          \
  X(Value, ValueError)                 /* a bad argument value */                                \
  X(Type, TypeError)                   /* a value of the wrong kind (tensor vs TensorDict ...) */ \
  X(Format, FormatError)               /* malformed or truncated files */                        \
  X(Backend, BackendError)             /* a storage backend failed (I/O, connection, actor) */   \
  X(Runtime, RuntimeError)             /* everything else upstream raises RuntimeError for */    \
  X(NotImplemented, NotImplementedError) /* an operation this backend does not support */ \
  X(Assertion, AssertionError)         /* upstream's assert (e.g. an invalid view shape) */      \
  X(Attribute, AttributeError)         /* upstream's AttributeError (a nested key through a tensor on get) */ \
  X(Distributed, DistributedError)     /* a process group failed: a peer died, timed out or sent another shape */

enum class ErrorCode : int {
#define TENSORDICT_ERROR_ENUM(code, Name) code,
  TENSORDICT_ERROR_TABLE(TENSORDICT_ERROR_ENUM)
#undef TENSORDICT_ERROR_ENUM
};

//! every code, in table order
inline constexpr ErrorCode kErrorCodes[] = {
#define TENSORDICT_ERROR_LIST(code, Name) ErrorCode::code,
    TENSORDICT_ERROR_TABLE(TENSORDICT_ERROR_LIST)
#undef TENSORDICT_ERROR_LIST
};

//! the Python-visible name of a code ("KeyError"); "RuntimeError" for a value outside the table
inline const char* error_name(ErrorCode code) noexcept {
  switch (code) {
#define TENSORDICT_ERROR_NAME(code, Name) \
  case ErrorCode::code:                   \
    return #Name;
    TENSORDICT_ERROR_TABLE(TENSORDICT_ERROR_NAME)
#undef TENSORDICT_ERROR_NAME
  }
  return "RuntimeError";
}

//! the code of a Python-visible name ("KeyError" -> Key); Runtime for an unknown name
inline ErrorCode error_code_of(const std::string& name) noexcept {
  for (ErrorCode c : kErrorCodes)
    if (name == error_name(c)) return c;
  return ErrorCode::Runtime;
}

//! the code of a number carried over the wire (static_cast<int>(code)); Runtime outside the table
inline ErrorCode error_code_from_int(int v) noexcept {
  for (ErrorCode c : kErrorCodes)
    if (static_cast<int>(c) == v) return c;
  return ErrorCode::Runtime;
}

//! Base of every error the library throws on purpose: what() is "Name: message" (e.g. "KeyError: ...");
//! code() and message() give the two parts. Only the typed children below construct it.
class Error : public std::runtime_error {
 public:
  ErrorCode code() const noexcept { return code_; }
  //! the message without the "Name: " prefix
  std::string message() const { return std::string(what() + std::strlen(error_name(code_)) + 2); }

 protected:
  Error(ErrorCode code, const std::string& message)
      : std::runtime_error(std::string(error_name(code)) + ": " + message), code_(code) {}

 private:
  ErrorCode code_;
};

#define TENSORDICT_DEFINE_ERROR(code, Name)                                              \
  class Name : public Error {                                                            \
   public:                                                                               \
    static constexpr ErrorCode kCode = ErrorCode::code;                                  \
    explicit Name(const std::string& message) : Error(ErrorCode::code, message) {}        \
  };
TENSORDICT_ERROR_TABLE(TENSORDICT_DEFINE_ERROR)
#undef TENSORDICT_DEFINE_ERROR

//! throws the typed error of `code` (KeyError for Key, ...) with `message`: what() is "Name: message"
[[noreturn]] inline void throw_error(ErrorCode code, const std::string& message) {
  switch (code) {
#define TENSORDICT_ERROR_THROW(code, Name) \
  case ErrorCode::code:                    \
    throw Name(message);
    TENSORDICT_ERROR_TABLE(TENSORDICT_ERROR_THROW)
#undef TENSORDICT_ERROR_THROW
  }
  throw RuntimeError(message);
}

}  // namespace tensordict
