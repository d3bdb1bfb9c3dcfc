//! tdx: inspect and convert tensordict data from the command line: memmap directories (Python tensordict /
//! tensordict-cpp), HDF5 files (PersistentTensorDict) and Redis stores (TensorDictStore).
//!
//!   tdx info PATH [--files]               the tree: keys, kinds, dtypes, shapes, sizes, non-tensor values, totals
//!   tdx dump PATH [--json [--compact] [--indent N]] [--no-values] [--threshold N] [--edgeitems N]
//!   tdx verify PATH [--max-bytes N]       every leaf present, readable, of the dtype and shape it claims
//!   tdx convert SRC DST [--quiet] [--force] [--durable]   any pair of the three, streamed in row chunks of <= 64 MiB
//!
//! PATH: a memmap directory, an .h5/.hdf5 file (opened with mode "r") or redis://HOST:PORT/DB?prefix=P&td_id=ID.
//! Memmap directories: `info` and `verify` only use backends::read_dir (no mapping at all), `dump` loads with
//! LoadOptions().writable(false) (private copy-on-write mappings). HDF5 files and Redis stores are read
//! through their store actor; `info` reads one row, `verify` every row in bounded chunks. Only `convert`
//! writes, and only to DST. Like the library, tdx refuses symlinks below a memmap PATH. `info` and `verify`
//! read with allow_missing, so a missing leaf file is a warning (info) or a problem (verify); `dump` refuses it.
//! Exit codes: 0 success, 1 `verify` found problems, 2 usage errors, unreadable input and an unwritable
//! stdout (message on stderr). Names, paths and messages are printed with control characters escaped, and
//! a Redis URL without its password.
//! Sources: tdx.cpp (the command line), tdx_common.* (shared helpers), tdx_info.cpp, tdx_dump.cpp,
//! tdx_verify.cpp, tdx_convert.cpp (one subcommand each).
#include <cstdint>
#include <iostream>
#include <limits>
#include <sstream>
#include <string>

#include <CLI/CLI.hpp>

#include "tdx_common.hpp"

using namespace tdx;

int main(int argc, char** argv) {
  CLI::App app{"tdx: inspect tensordict memmap directories, HDF5 files (PersistentTensorDict) and Redis stores\n"
               "(TensorDictStore), and convert between them. info/dump/verify never modify what they read.\n"
               "Exit: 0 ok, 1 verify found problems, 2 error.",
               "tdx"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "help for every subcommand");

  std::string path;
  bool files = false;
  size_t width = 60;
  CLI::App* info = app.add_subcommand("info", "the tree of a memmap directory: keys, kinds, dtypes, shapes, sizes, "
                                              "non-tensor values, sub-TensorDicts, lazy stacks, totals");
  info->add_option("PATH", path, "memmap directory (holding meta.json), .h5/.hdf5 file or redis://HOST:PORT/DB?prefix=P&td_id=ID")->required();
  info->add_flag("--files", files, "also show each leaf's file name and size on disk");
  info->add_option("--width", width, "truncate non-tensor values to this many characters")->capture_default_str();

  DumpOptions dump_opts;
  bool no_values = false;
  CLI::App* dump = app.add_subcommand("dump", "every leaf with its values (text like torch prints, or --json: the "
                                              "fixtures' expected.json layout)");
  dump->add_option("PATH", path, "memmap directory (holding meta.json), .h5/.hdf5 file or redis://HOST:PORT/DB?prefix=P&td_id=ID")->required();
  dump->add_flag("--json", dump_opts.json, "JSON: {loaded_type, structure, leaves} (NaN/Infinity as Python writes)");
  dump->add_flag("--compact", dump_opts.compact, "with --json: one line instead of indented");
  dump->add_option("--indent", dump_opts.indent, "with --json: spaces per level")->capture_default_str();
  dump->add_flag("--no-values", no_values, "a summary: keys, dtypes and shapes without the values");
  dump->add_option("--threshold", dump_opts.threshold, "text: summarize tensors with more elements (like torch)")
      ->capture_default_str();
  dump->add_option("--edgeitems", dump_opts.edgeitems, "text: elements kept at each end when summarizing")
      ->capture_default_str();

  CLI::App* verify = app.add_subcommand("verify", "check meta.json files and that every leaf file is present and "
                                                  "long enough; prints OK or one line per problem (exit 1)");
  verify->add_option("PATH", path, "memmap directory (holding meta.json), .h5/.hdf5 file or redis://HOST:PORT/DB?prefix=P&td_id=ID")->required();
  VerifyOptions verify_opts;
  verify->add_option("--max-bytes", verify_opts.max_bytes,
                     "HDF5 files and Redis stores declaring more tensor bytes than this are refused (they would be "
                     "read whole); 0: no limit")
      ->capture_default_str();
  verify->add_flag("--quiet,-q", verify_opts.quiet, "no progress on stderr");

  std::string dst_path;
  ConvertOptions conv_opts;
  CLI::App* convert = app.add_subcommand("convert", "copy SRC to DST (memmap directory, .h5 file, Redis store: any "
                                                    "pair) in row chunks of <= 64 MiB; prints the throughput");
  convert->add_option("SRC", path, "memmap directory, .h5/.hdf5 file or redis://HOST:PORT/DB?prefix=P&td_id=ID")
      ->required();
  convert->add_option("DST", dst_path, "a new memmap directory, a new .h5/.hdf5 file, or redis://HOST:PORT/DB?prefix=P "
                                       "(a new store; its address is printed)")
      ->required();
  convert->add_flag("--quiet,-q", conv_opts.quiet, "no progress bar");
  convert->add_flag("--force", conv_opts.force, "replace an existing DST file or directory / write into a given td_id");
  convert->add_flag("--durable", conv_opts.durable, "memmap / HDF5 DST: fsync every file of the copy before it is "
                                                    "switched in, and the parent directory after");

  // a clearer message than CLI11's "arguments were not expected" for a mistyped subcommand
  if (argc > 1 && argv[1][0] != '-') {
    const std::string sub = argv[1];
    if (sub != "info" && sub != "dump" && sub != "verify" && sub != "convert") {
      std::cerr << "tdx: unknown subcommand '" << sub << "' (expected info, dump, verify or convert; see tdx --help)\n";
      return kExitError;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return kExitError;
  }

  // messages never show a Redis password given in PATH / DST, nor raw control characters
  auto message = [&](const std::string& what) {
    std::string m = what;
    for (const std::string* arg : {&path, &dst_path}) {
      const std::string redacted = td::redact_url(*arg);
      if (!is_redis_address(*arg) || redacted == *arg) continue;
      for (size_t at = m.find(*arg); at != std::string::npos; at = m.find(*arg, at + redacted.size()))
        m.replace(at, arg->size(), redacted);
    }
    std::string out;
    std::istringstream lines(m);
    for (std::string line; std::getline(lines, line);) out += (out.empty() ? "" : "\n") + escape_text(line);
    return out;
  };
  int rc = kExitError;
  try {
    if (*info) {
      rc = cmd_info(path, files, width);
    } else if (*dump) {
      dump_opts.values = !no_values;
      dump_opts.width = std::max<size_t>(width, 200);
      rc = cmd_dump(path, dump_opts);
    } else if (*verify) {
      if (verify_opts.max_bytes < 0) throw ToolError("--max-bytes must be >= 0 (0: no limit)");
      rc = cmd_verify(path, verify_opts);
    } else if (*convert) {
      rc = cmd_convert(path, dst_path, conv_opts);
    }
    check_stdout();
  } catch (const ToolError& e) {
    std::cerr << "tdx: " << message(e.what()) << "\n";
    return kExitError;
  } catch (const std::exception& e) {  // tensordict::Error (FormatError...), c10::Error, I/O
    std::string what = e.what();
    if (auto nl = what.find("\nException raised from"); nl != std::string::npos) what.resize(nl);  // c10 backtraces
    std::cerr << "tdx: " << (*convert ? "convert " + shown(path) + " -> " + shown(dst_path) : shown(path)) << ": "
              << message(what) << "\n";
    return kExitError;
  }
  return rc;
}

