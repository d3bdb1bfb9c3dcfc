// tdx info: the tree of a memmap directory (read_dir: nothing mapped), an HDF5 file or a Redis store (one row).
#include <algorithm>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include "tdx_common.hpp"
#include "tensordict/backends/memmap_format.hpp"
#include "tensordict/describe.hpp"
#include "tensordict/tree.hpp"

namespace tdx {
namespace {

// ------------------------------------------------------------------------------------------ info
struct Row {
  int depth = 0;
  std::string name, kind, dtype, shape, bytes, value;
};

struct Totals {
  int64_t tensors = 0, non_tensors = 0, subs = 0, bytes = 0, files = 0, file_bytes = 0;
};

struct InfoWalker {
  bool show_files = false;
  size_t value_width = 60;
  std::vector<Row> rows;
  Totals totals;
  std::vector<std::string> warnings;

  static std::string batch_of(const tdb::DirNode& n) { return n.batch_size ? shape_str(*n.batch_size) : "?"; }

  static std::string non_tensor_value(const tdb::DirNode& n, size_t width) {
    if (n.data) return escape_text(truncate(json_line(*n.data), width));
    if (n.pickle) return "<pickled, " + std::to_string(n.pickle->data.size()) + " bytes>";
    return "<no data>";
  }

  void leaf_row(const tdb::DirNode& node, const tdb::LeafMeta& leaf, int depth) {
    Row r;
    r.depth = depth;
    r.name = escape_text(leaf.key);
    r.kind = leaf.is_nested ? "nested tensor" : "tensor";
    r.dtype = short_dtype(leaf.dtype);
    if (leaf.is_nested) {
      r.shape = std::to_string(leaf.nested_sizes.size()) + " components";
    } else {
      r.shape = shape_str(leaf.shape);
    }
    r.bytes = human_bytes(leaf.nbytes());
    ++totals.tensors;
    totals.bytes += leaf.nbytes();
    for (const std::string* f : {&leaf.file, &leaf.shape_file}) {
      if (f->empty()) continue;
      int64_t size = 0;
      path_kind(join_path(node.path, *f), &size);
      ++totals.files;
      totals.file_bytes += size;
      if (show_files) r.value += (r.value.empty() ? "" : ", ") + escape_text(*f) + " (" + std::to_string(size) + " bytes)";
    }
    if (show_files && leaf.file.empty()) r.value = "(no file: empty)";
    rows.push_back(std::move(r));
  }

  void child_row(const std::string& name, const tdb::DirNode& child, int depth) {
    Row r;
    r.depth = depth;
    r.name = escape_text(name);
    switch (child.kind) {
      case tdb::NodeKind::NonTensorData:
        r.kind = child.type_repr == tdb::type_repr::kMetaData ? "MetaData" : "NonTensorData";
        r.value = non_tensor_value(child, value_width);
        ++totals.non_tensors;
        rows.push_back(std::move(r));
        break;
      case tdb::NodeKind::NonTensorStack:
        r.kind = "NonTensorStack";
        r.shape = batch_of(child);
        r.value = non_tensor_value(child, value_width);
        ++totals.non_tensors;
        rows.push_back(std::move(r));
        break;
      case tdb::NodeKind::TensorDict:
        r.name += "/";
        r.kind = "TensorDict";
        r.shape = "batch " + batch_of(child);
        ++totals.subs;
        rows.push_back(std::move(r));
        walk(child, depth + 1);
        break;
      case tdb::NodeKind::LazyStackedTensorDict:
        r.name += "/";
        r.kind = "LazyStackedTensorDict";
        r.shape = "batch " + batch_of(child);
        r.value = "stack_dim " + std::to_string(child.stack_dim) + ", " + std::to_string(child.entries.size()) +
                  " members";
        ++totals.subs;
        rows.push_back(std::move(r));
        walk(child, depth + 1);
        break;
      case tdb::NodeKind::TensorClass:
        r.name += "/";
        r.kind = tdb::default_child_type(child) + " (tensorclass)";
        r.shape = "batch " + batch_of(child);
        ++totals.subs;
        rows.push_back(std::move(r));
        walk(child, depth + 1);
        break;
      case tdb::NodeKind::Other:
        r.name += "/";
        r.kind = tdb::default_child_type(child);
        r.shape = child.batch_size ? "batch " + batch_of(child) : "";
        r.value = "(not loadable: " + child.type_repr + ")";
        ++totals.subs;
        rows.push_back(std::move(r));
        walk(child, depth + 1);
        break;
    }
  }

  void walk(const tdb::DirNode& node, int depth) {
    for (const auto& w : node.warnings) warnings.push_back(escape_text(node.path + ": " + w));
    if (node.kind == tdb::NodeKind::TensorClass && node.data && node.data->is_object()) {
      for (const auto& kv : node.data->as_object()) {  // non-tensor fields kept in the class's meta.json
        Row r;
        r.depth = depth;
        r.name = escape_text(kv.first);
        r.kind = "field";
        r.value = escape_text(truncate(json_line(kv.second), value_width));
        rows.push_back(std::move(r));
      }
    }
    for (const auto& e : node.entries) {
      if (e.is_leaf) {
        leaf_row(node, e.leaf, depth);
      } else if (node.kind == tdb::NodeKind::TensorClass && e.key == "_tensordict") {
        for (const auto& w : e.child->warnings) warnings.push_back(escape_text(e.child->path + ": " + w));
        walk_entries_only(*e.child, depth);  // a tensorclass shows its fields directly
      } else if (node.kind == tdb::NodeKind::LazyStackedTensorDict) {
        child_row("[" + e.key + "]", *e.child, depth);
      } else {
        child_row(e.key, *e.child, depth);
      }
    }
  }

  void walk_entries_only(const tdb::DirNode& node, int depth) {
    for (const auto& e : node.entries) {
      if (e.is_leaf)
        leaf_row(node, e.leaf, depth);
      else
        child_row(e.key, *e.child, depth);
    }
  }
};

std::string root_line(const tdb::DirNode& root) {
  std::string device = root.device ? *root.device : "None";
  switch (root.kind) {
    case tdb::NodeKind::TensorDict:
      return "TensorDict  batch_size=" + InfoWalker::batch_of(root) + "  device=" + device;
    case tdb::NodeKind::LazyStackedTensorDict:
      return "LazyStackedTensorDict  batch_size=" + InfoWalker::batch_of(root) +
             "  stack_dim=" + std::to_string(root.stack_dim) + "  members=" + std::to_string(root.entries.size());
    case tdb::NodeKind::TensorClass:
      return tdb::default_child_type(root) + " (tensorclass " + root.type_repr + ")  batch_size=" +
             InfoWalker::batch_of(root) + "  device=" + device;
    case tdb::NodeKind::NonTensorData:
      return "NonTensorData  value=" + InfoWalker::non_tensor_value(root, 200);
    case tdb::NodeKind::NonTensorStack:
      return "NonTensorStack  batch_size=" + InfoWalker::batch_of(root) + "  value=" +
             InfoWalker::non_tensor_value(root, 200);
    case tdb::NodeKind::Other: return root.type_repr + " (not loadable as a TensorDict)";
  }
  return root.type_repr;
}

void print_rows(const std::vector<Row>& rows, std::ostream& os) {
  Row header;
  header.name = "KEY";
  header.kind = "KIND";
  header.dtype = "DTYPE";
  header.shape = "SHAPE";
  header.bytes = "BYTES";
  header.value = "VALUE";
  std::vector<Row> safe = rows;  // names, kinds and values as text: control characters escaped
  for (Row& r : safe)
    for (std::string* s : {&r.name, &r.kind, &r.dtype, &r.shape, &r.value}) *s = escape_text(*s);
  std::vector<const Row*> all{&header};
  for (const auto& r : safe) all.push_back(&r);
  size_t w[4] = {0, 0, 0, 0}, wb = 0;
  for (const Row* r : all) {
    w[0] = std::max(w[0], 2 * static_cast<size_t>(r->depth) + r->name.size());
    w[1] = std::max(w[1], r->kind.size());
    w[2] = std::max(w[2], r->dtype.size());
    w[3] = std::max(w[3], r->shape.size());
    wb = std::max(wb, r->bytes.size());
  }
  for (const Row* r : all) {
    std::string line = "  " + std::string(2 * static_cast<size_t>(r->depth), ' ') + r->name;
    auto pad_to = [&](size_t width) { line.resize(std::max(line.size(), width), ' '); };
    pad_to(2 + w[0] + 2);
    line += r->kind;
    pad_to(2 + w[0] + 2 + w[1] + 2);
    line += r->dtype;
    pad_to(2 + w[0] + 2 + w[1] + 2 + w[2] + 2);
    line += r->shape;
    pad_to(2 + w[0] + 2 + w[1] + 2 + w[2] + 2 + w[3] + 2);
    line += std::string(wb - r->bytes.size(), ' ') + r->bytes;  // right-aligned
    if (!r->value.empty()) line += "  " + r->value;
    while (!line.empty() && line.back() == ' ') line.pop_back();
    os << line << "\n";
  }
}

int cmd_info_store(const std::string& path, InputKind kind, size_t width) {
  Input in = open_store_input(path, kind);
  td::BatchSize batch = in.td.batch_size();
  td::TensorDict p = in.lazy ? td::TensorDict() : preview_of(in.td);
  std::vector<Row> rows;
  Totals totals;
  auto walk = [&](const td::TensorDict& d, int depth0) {
    td::walk_entries(d, [&](const td::NestedKey& key, const td::Entry& e) {
      Row r;
      r.depth = depth0 + static_cast<int>(key.size()) - 1;
      r.name = escape_text(key[key.size() - 1]);
      if (e.is_tensordict()) {
        r.name += "/";
        r.kind = e.tensordict().type_name();
        r.shape = "batch " + shape_str(full_shape(e.tensordict().batch_size(), batch));
        ++totals.subs;
        rows.push_back(std::move(r));
        return true;
      } else if (e.is_tensor()) {
        const at::Tensor& x = e.tensor();
        std::vector<int64_t> shape = full_shape(x.sizes().vec(), batch);
        int64_t n = 1;
        for (auto s : shape) n *= s;
        const int64_t bytes = n * static_cast<int64_t>(c10::elementSize(x.scalar_type()));
        r.kind = "tensor";
        r.dtype = short_dtype(x.scalar_type());
        r.shape = shape_str(shape);
        r.bytes = human_bytes(bytes);
        ++totals.tensors;
        totals.bytes += bytes;
        rows.push_back(std::move(r));
      } else if (e.is_non_tensor_data()) {
        r.kind = "NonTensorData";
        r.value = escape_text(truncate(json_line(e.non_tensor_data().value()), width));
        ++totals.non_tensors;
        rows.push_back(std::move(r));
      } else if (e.is_non_tensor_stack()) {
        r.kind = "NonTensorStack";
        r.shape = shape_str(full_shape(e.non_tensor_stack().batch_size(), batch));
        r.value = "(first row) " + escape_text(truncate(json_line(e.non_tensor_stack().tolist()), width));
        ++totals.non_tensors;
        rows.push_back(std::move(r));
      }
      return false;
    });
  };
  std::string root = store_root_line(in.td);
  if (in.lazy) {  // a lazy-stack store (read whole): its members, as for a lazy-stack directory
    const auto& members = in.lazy->tensordicts();
    root = input_type(in) + "  batch_size=" + shape_str(in.lazy->batch_size()) +
           "  stack_dim=" + std::to_string(in.lazy->stack_dim()) + "  members=" + std::to_string(members.size());
    for (size_t i = 0; i < members.size(); ++i) {
      batch = members[i].batch_size();
      Row r;
      r.name = "[" + std::to_string(i) + "]/";
      r.kind = members[i].type_name();
      r.shape = "batch " + shape_str(batch);
      rows.push_back(std::move(r));
      walk(members[i], 1);
    }
  } else {
    walk(p, 0);
  }
  std::cout << shown(path) << "\n" << escape_text(root) << "\n";
  if (!rows.empty()) print_rows(rows, std::cout);
  std::cout << "total: " << count(totals.tensors + totals.non_tensors, "leaf", "leaves") << " ("
            << count(totals.tensors, "tensor", "tensors") << ", "
            << count(totals.non_tensors, "non-tensor", "non-tensors") << "), "
            << count(totals.subs, "sub-tensordict", "sub-tensordicts") << ", " << human_bytes(totals.bytes)
            << " of tensor data";
  if (totals.bytes >= 1024) std::cout << " (" << totals.bytes << " bytes)";
  if (kind == InputKind::H5) {
    int64_t size = 0;
    path_kind(path, &size);
    std::cout << " in an HDF5 file of " << size << " bytes";
  } else {
    std::cout << " in a Redis store";
  }
  std::cout << "\n";
  in.close();
  return 0;
}

}  // namespace

int cmd_info(const std::string& path, bool files, size_t width) {
  if (InputKind k = input_kind(path); k != InputKind::Memmap) return cmd_info_store(path, k, width);
  check_input_dir(path);
  tdb::ReadOptions ro;
  ro.allow_missing = true;  // shown as a warning
  tdb::DirNode root = tdb::read_dir(path, ro);
  InfoWalker w;
  w.show_files = files;
  w.value_width = width;
  w.walk(root, 0);
  std::cout << shown(path) << "\n" << escape_text(root_line(root)) << "\n";
  if (!w.rows.empty()) print_rows(w.rows, std::cout);
  const Totals& t = w.totals;
  std::cout << "total: " << count(t.tensors + t.non_tensors, "leaf", "leaves") << " ("
            << count(t.tensors, "tensor", "tensors") << ", " << count(t.non_tensors, "non-tensor", "non-tensors")
            << "), " << count(t.subs, "sub-tensordict", "sub-tensordicts") << ", " << human_bytes(t.bytes)
            << " of tensor data";
  if (t.bytes >= 1024) std::cout << " (" << t.bytes << " bytes)";
  std::cout << " in " << count(t.files, "file", "files");
  if (t.file_bytes != t.bytes) std::cout << " (" << t.file_bytes << " bytes on disk)";
  std::cout << "\n";
  for (const auto& warn : w.warnings) std::cerr << "tdx: warning: " << warn << "\n";
  return 0;
}


}  // namespace tdx
