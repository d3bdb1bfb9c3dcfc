#pragma once
//! Internal to engine/: how a storage spec carries its view (spec_index.cpp) and the lazy stack's "stack"
//! driver (spec_stack.cpp). The public side is tensordict/storage_spec.hpp.
#include <memory>
#include <string>

#include "tensordict/backends/json_value.hpp"
#include "tensordict/index_math.hpp"
#include "tensordict/storage_spec.hpp"

namespace tensordict {

struct TensorDictImpl;

namespace detail {

//! where a view of a memmap / shared TensorDict comes from: td[a] holds {root, root's batch, a}; td[a][b]
//! holds {parent: td[a]'s origin, b}. Kept as the chain of the user's indices (nothing resolved while
//! indexing: a row read stays as cheap as before); StorageSpec::of resolves and composes them once.
struct ViewOrigin {
  //! the origin of the node that was indexed; null when that node was the root itself
  std::shared_ptr<const ViewOrigin> parent;
  //! the memmap / shared TensorDict the chain starts at, and its batch size then (set when parent is null)
  std::shared_ptr<const TensorDictImpl> root;
  BatchSize root_batch;
  //! the index applied to the parent (or the root)
  Index index;
};

//! records on `out` (the result of src.index(index), a new dense node) where it comes from, when src is a
//! memmap TensorDict saved to a directory, a shared one, or itself such a view; otherwise nothing
void carry_view_origin(const TensorDictImpl& src, const Index& index, const TensorDict& out);

//! whether td is a view (td[idx]) of a memmap TensorDict saved to a directory or of a shared one: writes into
//! it reach that storage, and StorageSpec::of(td) reopens it (what map's worker processes need of an out)
bool is_storage_view(const TensorDict& td);

//! ValueError naming the problem when a spec's fields are malformed: its "index", and a stack's "dim" and
//! "members" (each member validated in turn); no I/O
void check_spec_fields(const std::string& driver, const JsonValue& json);

//! the "index" field for a selection (null when it selects the whole batch in order)
JsonValue index_field(const ResolvedIndex& index);
//! td indexed by an "index" field (validated): the steps td.index() takes, views where the selection allows
TensorDict apply_index_field(const TensorDict& td, const JsonValue& field);

//! lowercase hex of bytes (the "shared" driver's handle)
std::string to_hex(const std::string& bytes);

//! the "stack" driver: opens every member spec, then lazy-stacks them along "dim"
StorageDriver stack_storage_driver();
//! the "stack" fields' checks (check_spec_fields calls it)
void check_stack_fields(const JsonValue& json);

}  // namespace detail
}  // namespace tensordict
