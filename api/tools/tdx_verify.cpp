// tdx verify: a memmap directory's meta.json files and leaf files (sizes and readability, checked without
// mapping anything), or every row of an HDF5 file or a Redis store read in bounded chunks.
#include <sys/stat.h>
#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "tdx_common.hpp"
#include "tensordict/actors/progress.hpp"
#include "tensordict/backends/memmap_format.hpp"
#include "tensordict/describe.hpp"
#include "tensordict/errors.hpp"

namespace tdx {
namespace {

struct StoreVerifier {
  VerifyOptions options;
  std::vector<std::string> problems;
  int64_t leaves = 0, bytes = 0;

  //! the size check up front: a store declaring more than --max-bytes is refused before a row is read
  void check_size(const Layout& l) const {
    if (options.max_bytes <= 0 || l.total_bytes() <= options.max_bytes) return;
    const LeafSpec* largest = nullptr;
    for (const auto& s : l.tensors)
      if (!largest || s.row_bytes > largest->row_bytes) largest = &s;
    std::string what = "declares " + human_bytes(l.total_bytes()) + " of tensor data";
    if (largest)
      what += " (leaf '" + key_str(largest->key) + "': " + short_dtype(largest->dtype) + " " +
              shape_str(l.leaf_shape(*largest, l.batch[0])) + ")";
    throw ToolError("verify reads every row; this store " + what + ", more than --max-bytes " +
                    std::to_string(options.max_bytes) + " (" + human_bytes(options.max_bytes) +
                    "): pass a larger --max-bytes, or --max-bytes 0 for no limit");
  }

  void check(const td::TensorDict& t) {
    Layout l;
    try {
      l = layout_of(t);
    } catch (const std::exception& e) {
      problems.push_back(std::string("cannot read the first row: ") + first_line(e.what()));
      return;
    }
    leaves = static_cast<int64_t>(l.tensors.size() + l.non_tensors.size());
    bytes = l.total_bytes();
    check_size(l);
    if (l.batch.empty()) {  // 0-dim batch: one read
      try {
        td::TensorDict all = t.to_tensordict();
        for (const auto& s : l.tensors) compare(s, all, s.elem, "");
      } catch (const std::exception& e) {
        problems.push_back(std::string("unreadable: ") + first_line(e.what()));
      }
      return;
    }
    const int64_t n = l.batch[0], step = rows_per_chunk(l);
    std::vector<bool> bad(l.tensors.size(), false);
    td::actors::Progress bar(!options.quiet && n > step, (n + step - 1) / step, std::chrono::milliseconds(1000),
                             "tdx verify");
    int64_t done = 0;
    for (int64_t a = 0; a < n; a += step, bar.update(++done)) {
      const int64_t b = std::min(n, a + step);
      const std::string rows = "rows " + std::to_string(a) + ".." + std::to_string(b);
      td::TensorDict view = t.index({at::indexing::Slice(a, b)});
      try {
        td::TensorDict chunk = view.to_tensordict();
        for (size_t i = 0; i < l.tensors.size(); ++i)
          if (!bad[i]) bad[i] = !compare(l.tensors[i], chunk, l.leaf_shape(l.tensors[i], b - a), rows);
      } catch (const std::exception&) {  // which leaves: one read each
        for (size_t i = 0; i < l.tensors.size(); ++i) {
          if (bad[i]) continue;
          try {
            at::Tensor x = view.get(l.tensors[i].key);
            bad[i] = !compare_tensor(l.tensors[i], x, l.leaf_shape(l.tensors[i], b - a), rows);
          } catch (const std::exception& e) {
            problems.push_back("leaf '" + key_str(l.tensors[i].key) + "': " + rows + " unreadable: " + first_line(e.what()));
            bad[i] = true;
          }
        }
      }
    }
    bar.finish(true);
  }

  bool compare(const LeafSpec& s, const td::TensorDict& chunk, const std::vector<int64_t>& want,
               const std::string& rows) {
    if (!chunk.contains(s.key)) {
      problems.push_back("leaf '" + key_str(s.key) + "': " + rows + " missing");
      return false;
    }
    return compare_tensor(s, chunk.get(s.key), want, rows);
  }
  bool compare_tensor(const LeafSpec& s, const at::Tensor& x, const std::vector<int64_t>& want,
                      const std::string& rows) {
    const std::string where = "leaf '" + key_str(s.key) + "'" + (rows.empty() ? "" : ": " + rows);
    if (x.scalar_type() != s.dtype) {
      problems.push_back(where + ": dtype " + td::dtype_repr(x.scalar_type()) + ", expected " + td::dtype_repr(s.dtype));
      return false;
    }
    if (x.sizes().vec() != want) {
      problems.push_back(where + ": shape " + shape_str(x.sizes().vec()) + ", expected " + shape_str(want));
      return false;
    }
    return true;
  }
};

int cmd_verify_store(const std::string& path, InputKind kind, const VerifyOptions& o) {
  StoreVerifier v;
  v.options = o;
  Input in;
  try {
    in = open_store_input(path, kind);
  } catch (const ToolError&) {
    throw;
  } catch (const std::exception& e) {
    v.problems.push_back(std::string("cannot open: ") + first_line(e.what()));
  }
  if (in.close) {
    auto close = [&] {
      try {
        in.close();
      } catch (const std::exception&) {
      }
    };
    try {
      if (in.lazy) {  // a lazy-stack store, read whole (its layout and every member's bytes checked): each member
        int64_t leaves = 0, bytes = 0;
        for (const auto& m : in.lazy->tensordicts()) {
          v.check(m);
          leaves += v.leaves;
          bytes += v.bytes;
        }
        v.leaves = leaves;
        v.bytes = bytes;
      } else {
        v.check(in.td);
      }
    } catch (...) {
      close();
      throw;
    }
    close();
  }
  if (!v.problems.empty()) {
    for (const auto& p : v.problems) std::cout << "PROBLEM: " << shown(path) << ": " << escape_text(p) << "\n";
    std::cout << "FAILED: " << v.problems.size() << " problem" << (v.problems.size() == 1 ? "" : "s") << " in "
              << shown(path) << "\n";
    return kExitProblems;
  }
  std::cout << "OK: " << v.leaves << " leaves, " << v.bytes << " bytes";
  if (v.bytes >= 1024) std::cout << " (" << human_bytes(v.bytes) << ")";
  std::cout << "\n";
  return 0;
}

// ------------------------------------------------------------------------------------------ verify
bool warning_is_problem(const std::string& w) {
  return w.find("missing") != std::string::npos || w.find("short") != std::string::npos;
}

struct Verifier {
  std::vector<std::string> problems, notes;
  int64_t leaves = 0, bytes = 0;

  void check_file(const tdb::DirNode& node, const std::string& key, const std::string& file, int64_t need,
                  const char* what) {
    const std::string p = join_path(node.path, file);
    int64_t size = 0;
    PathKind k = path_kind(p, &size);
    if (k == PathKind::Missing)
      problems.push_back(p + ": " + what + " of leaf '" + key + "' is missing");
    else if (k != PathKind::File)
      problems.push_back(p + ": " + what + " of leaf '" + key + "' is not a regular file");
    else if (size < need)
      problems.push_back(p + ": " + what + " of leaf '" + key + "' is truncated: expected at least " +
                         std::to_string(need) + " bytes, found " + std::to_string(size));
    else if (std::string why = unreadable_reason(p); !why.empty())
      problems.push_back(p + ": " + what + " of leaf '" + key + "' cannot be read: " + why);
  }

  void walk(const tdb::DirNode& node) {
    for (const auto& w : node.warnings) (warning_is_problem(w) ? problems : notes).push_back(node.path + ": " + w);
    if (node.kind == tdb::NodeKind::NonTensorData || node.kind == tdb::NodeKind::NonTensorStack) {
      ++leaves;
      if (!node.data && !node.pickle) problems.push_back(node.path + ": non-tensor without data or pickle");
    }
    for (const auto& e : node.entries) {
      if (!e.is_leaf) {
        walk(*e.child);
        continue;
      }
      const tdb::LeafMeta& leaf = e.leaf;
      ++leaves;
      bytes += leaf.nbytes();
      if (!leaf.file.empty())
        check_file(node, leaf.key, leaf.file, leaf.nbytes(), "data file");
      else if (leaf.nbytes() > 0)
        problems.push_back(node.path + ": leaf '" + leaf.key + "' has no data file");
      if (leaf.is_nested && !leaf.shape_file.empty() && leaf.shape.size() == 2)
        check_file(node, leaf.key, leaf.shape_file, leaf.shape[0] * leaf.shape[1] * 8, "sizes file");
    }
  }
};

//! When read_dir fails (it stops at the first error), a tolerant scan of the whole tree to report every
//! problem: unreadable meta.json, missing sub-directories, missing or short leaf files, symlinks (never
//! followed, as read_dir refuses them) and files that are not regular files.
struct FallbackScanner {
  std::vector<std::string> problems;

  static bool is_symlink(const std::string& p) {
    struct stat st {};
    return ::lstat(p.c_str(), &st) == 0 && S_ISLNK(st.st_mode);
  }

  static std::optional<std::string> locate(const std::string& dir, const std::string& key, const std::string& suffix,
                                           PathKind want) {
    std::string enc = tdb::encode_key(key) + suffix;
    if (path_kind(join_path(dir, enc)) == want) return enc;
    if (tdb::is_safe_legacy_key(key, want == PathKind::Directory) && path_kind(join_path(dir, key + suffix)) == want)
      return key + suffix;
    return std::nullopt;
  }

  static std::vector<std::string> subdirs(const std::string& dir) {
    std::vector<std::string> out;
    if (DIR* d = ::opendir(dir.c_str())) {
      while (dirent* de = ::readdir(d)) {
        std::string n = de->d_name;
        if (n != "." && n != ".." && path_kind(join_path(dir, n)) == PathKind::Directory) out.push_back(n);
      }
      ::closedir(d);
    }
    std::sort(out.begin(), out.end());
    return out;
  }

  void leaf(const std::string& dir, const std::string& meta_path, const std::string& key, const JsonValue& v) {
    const JsonValue* dtype = v.find("dtype");
    const JsonValue* shape = v.find("shape");
    if (!dtype || !shape) return;
    std::optional<at::ScalarType> dt = dtype->is_string() ? tdb::dtype_from_string(dtype->as_string()) : std::nullopt;
    if (!dt) {
      problems.push_back(meta_path + ": leaf '" + key + "': bad dtype " + json_line(*dtype));
      return;
    }
    int64_t numel = 1;
    if (!shape->is_array()) {
      problems.push_back(meta_path + ": leaf '" + key + "': bad shape " + json_line(*shape));
      return;
    }
    for (const auto& d : shape->as_array()) {
      if (!d.is_int() || d.as_int() < 0) {
        problems.push_back(meta_path + ": leaf '" + key + "': bad shape " + json_line(*shape));
        return;
      }
      numel *= d.as_int();
    }
    const JsonValue* nested = v.find("is_nested");
    const bool is_nested = nested && nested->is_bool() && nested->as_bool();
    const int64_t need = is_nested ? 0 : numel * static_cast<int64_t>(c10::elementSize(*dt));
    const std::string enc = join_path(dir, tdb::encode_key(key) + ".memmap");
    if (is_symlink(enc)) {
      problems.push_back(enc + ": data file of leaf '" + key + "' is a symlink");
      return;
    }
    if (path_kind(enc) == PathKind::Other) {
      problems.push_back(enc + ": data file of leaf '" + key + "' is not a regular file");
      return;
    }
    auto name = locate(dir, key, ".memmap", PathKind::File);
    if (!name) {
      if (numel > 0)
        problems.push_back(join_path(dir, tdb::encode_key(key) + ".memmap") + ": data file of leaf '" + key +
                           "' is missing");
      return;
    }
    int64_t size = 0;
    path_kind(join_path(dir, *name), &size);
    if (size < need)
      problems.push_back(join_path(dir, *name) + ": data file of leaf '" + key + "' is truncated: expected at least " +
                         std::to_string(need) + " bytes, found " + std::to_string(size));
    else if (std::string why = unreadable_reason(join_path(dir, *name)); !why.empty())
      problems.push_back(join_path(dir, *name) + ": data file of leaf '" + key + "' cannot be read: " + why);
  }

  //! scans `dir`; sub-directories are scanned when they hold a meta.json or the meta.json here lists them
  void scan(const std::string& dir, int depth = 0) {
    if (depth > 128) return;
    const std::string meta_path = join_path(dir, "meta.json");
    if (is_symlink(meta_path)) {
      problems.push_back(meta_path + ": is a symlink");
      return;
    }
    if (path_kind(meta_path) != PathKind::File) {
      problems.push_back(dir + ": missing meta.json");
      return;
    }
    if (std::string why = unreadable_reason(meta_path); !why.empty()) {
      problems.push_back(meta_path + ": cannot be read: " + why);
      return;
    }
    std::vector<std::string> listed;
    std::ifstream in(meta_path, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    try {
      JsonValue meta = JsonValue::parse(ss.str());
      if (!meta.is_object()) {
        problems.push_back(meta_path + ": expected a JSON object, found " + JsonValue::kind_name(meta.kind()));
      } else {
        for (const auto& kv : meta.as_object()) {
          if (!kv.second.is_object()) continue;
          if (kv.second.find("type")) {
            if (auto name = locate(dir, kv.first, "", PathKind::Directory))
              listed.push_back(*name);
            else
              problems.push_back(meta_path + ": sub-collection '" + kv.first + "' has no directory '" +
                                 tdb::encode_key(kv.first) + "'");
          } else {
            leaf(dir, meta_path, kv.first, kv.second);
          }
        }
      }
    } catch (const std::exception& e) {
      problems.push_back(meta_path + ": " + e.what());
    }
    for (const auto& s : subdirs(dir)) {
      const std::string sub = join_path(dir, s);
      if (path_kind(join_path(sub, "meta.json")) != PathKind::File &&
          std::find(listed.begin(), listed.end(), s) == listed.end())
        continue;
      if (is_symlink(sub))
        problems.push_back(sub + ": is a symlink");
      else
        scan(sub, depth + 1);
    }
  }
};

}  // namespace

int cmd_verify(const std::string& path, const VerifyOptions& o) {
  if (InputKind k = input_kind(path); k != InputKind::Memmap) return cmd_verify_store(path, k, o);
  check_input_dir(path);
  Verifier v;
  try {
    tdb::ReadOptions ro;
    ro.allow_missing = true;  // reported as a problem by walk
    tdb::DirNode root = tdb::read_dir(path, ro);
    v.walk(root);
  } catch (const std::exception& e) {  // a FormatError, or an unreadable meta.json
    FallbackScanner scan;
    scan.scan(path);
    v.problems = scan.problems;
    if (v.problems.empty()) v.problems.push_back(e.what());
  }
  for (const auto& n : v.notes) std::cout << "note: " << escape_text(n) << "\n";
  if (!v.problems.empty()) {
    for (const auto& p : v.problems) std::cout << "PROBLEM: " << escape_text(p) << "\n";
    std::cout << "FAILED: " << v.problems.size() << " problem" << (v.problems.size() == 1 ? "" : "s") << " in "
              << shown(path) << "\n";
    return kExitProblems;
  }
  std::cout << "OK: " << v.leaves << " leaves, " << v.bytes << " bytes";
  if (v.bytes >= 1024) std::cout << " (" << human_bytes(v.bytes) << ")";
  std::cout << "\n";
  return 0;
}

}  // namespace tdx
