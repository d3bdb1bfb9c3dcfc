#pragma once
//! The tensordict exception hierarchy: one base, typed children (libtorch's style: errors are exceptions).
#include <stdexcept>
#include <string>

namespace tensordict {

//! Base of every error the library throws on purpose.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

#define TENSORDICT_DEFINE_ERROR(Name)                                  \
  class Name : public Error {                                          \
   public:                                                             \
    explicit Name(const std::string& what) : Error(#Name ": " + what) {} \
  };

TENSORDICT_DEFINE_ERROR(KeyError)        //!< missing key, key of the wrong kind, key collisions
TENSORDICT_DEFINE_ERROR(IndexError)      //!< bad index on the batch dims
TENSORDICT_DEFINE_ERROR(LockedError)     //!< structural change on a locked TensorDict
TENSORDICT_DEFINE_ERROR(BatchSizeError)  //!< leaf shapes that do not fit the batch size
TENSORDICT_DEFINE_ERROR(ValueError)      //!< a bad argument value
TENSORDICT_DEFINE_ERROR(TypeError)       //!< a value of the wrong kind (tensor vs TensorDict vs non-tensor)
TENSORDICT_DEFINE_ERROR(FormatError)     //!< malformed or truncated files
TENSORDICT_DEFINE_ERROR(BackendError)    //!< a storage backend failed (I/O, connection, actor)
TENSORDICT_DEFINE_ERROR(RuntimeError)    //!< everything else upstream raises RuntimeError for

#undef TENSORDICT_DEFINE_ERROR

}  // namespace tensordict
