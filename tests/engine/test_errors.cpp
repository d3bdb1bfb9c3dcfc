// The error-code table (errors.hpp), carrying errors across a boundary (map_detail::carry_current_exception /
// rethrow) and the translation of libtorch's errors.
#include <boost/test/unit_test.hpp>

#include <set>
#include <stdexcept>

#include "tensordict/errors.hpp"
#include "tensordict/map.hpp"
#include "tensordict/tensor_dict.hpp"
#include "zoo.hpp"

using namespace tensordict;

namespace {

//! the exception f throws, carried as a worker carries it
template <class F>
map_detail::CarriedError carried(F&& f, int64_t chunk = -1) {
  try {
    f();
  } catch (...) {
    return map_detail::carry_current_exception(chunk);
  }
  BOOST_FAIL("expected an exception");
  return {};
}

//! code(), message() and what() of the Error that f throws (a non-Error fails the test)
struct Caught {
  ErrorCode code = ErrorCode::Runtime;
  std::string message, what;
};
template <class F>
Caught caught(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return {e.code(), e.message(), e.what()};
  } catch (const std::exception& e) {
    BOOST_FAIL(std::string("not a tensordict::Error: ") + e.what());
  }
  BOOST_FAIL("expected an exception");
  return {};
}

}  // namespace

BOOST_AUTO_TEST_SUITE(errors)

BOOST_AUTO_TEST_CASE(table_names_and_codes_round_trip) {
  std::set<std::string> names;
  for (ErrorCode c : kErrorCodes) {
    const std::string name = error_name(c);
    BOOST_TEST_CONTEXT(name) {
      BOOST_TEST(names.insert(name).second);
      BOOST_TEST(name.size() > 5);
      BOOST_TEST(name.substr(name.size() - 5) == "Error");
      BOOST_TEST((error_code_of(name) == c));
      BOOST_TEST((error_code_from_int(static_cast<int>(c)) == c));
      Caught k = caught([&] { throw_error(c, "the message"); });
      BOOST_TEST((k.code == c));
      BOOST_TEST(k.message == "the message");
      BOOST_TEST(k.what == name + ": the message");
    }
  }
  BOOST_TEST(names.size() == 13u);
  BOOST_TEST(names.count("DistributedError") == 1u);  // the last one added (issue 37: c10d failures)
  // unknown names and numbers: RuntimeError
  BOOST_TEST((error_code_of("NoSuchError") == ErrorCode::Runtime));
  BOOST_TEST((error_code_of("") == ErrorCode::Runtime));
  BOOST_TEST((error_code_of("keyerror") == ErrorCode::Runtime));
  BOOST_TEST((error_code_from_int(-1) == ErrorCode::Runtime));
  BOOST_TEST((error_code_from_int(1000) == ErrorCode::Runtime));
}

BOOST_AUTO_TEST_CASE(every_code_throws_its_typed_class) {
  // throw_error(code) is caught as the class of the table's row, and that class carries the code
#define TD_CHECK_ROW(C, Name)                                                                     \
  BOOST_TEST_CONTEXT(#Name) {                                                                     \
    BOOST_TEST(std::string(error_name(ErrorCode::C)) == #Name);                                   \
    BOOST_TEST((Name::kCode == ErrorCode::C));                                                    \
    BOOST_CHECK_THROW(throw_error(ErrorCode::C, "m"), Name);                                      \
    BOOST_TEST(zoo::message_of<Name>([] { throw_error(ErrorCode::C, "m"); }) == #Name ": m");     \
    Name direct("direct");                                                                        \
    BOOST_TEST(std::string(direct.what()) == #Name ": direct");                                   \
    BOOST_TEST((direct.code() == ErrorCode::C));                                                  \
    BOOST_TEST(direct.message() == "direct");                                                     \
    const Error& base = direct;                                                                   \
    BOOST_TEST(std::string(base.what()) == #Name ": direct");                                     \
  }
  TENSORDICT_ERROR_TABLE(TD_CHECK_ROW)
#undef TD_CHECK_ROW
  // the classes stay distinct: a KeyError is not caught as an IndexError
  BOOST_TEST(zoo::message_of<Error>([] {
               try {
                 throw_error(ErrorCode::Key, "k");
               } catch (const IndexError&) {
                 BOOST_FAIL("a KeyError caught as IndexError");
               }
             }) == "KeyError: k");
}

BOOST_AUTO_TEST_CASE(what_is_unchanged_and_not_implemented_exists) {
  BOOST_TEST(std::string(KeyError("'a' not found").what()) == "KeyError: 'a' not found");
  BOOST_TEST(std::string(BatchSizeError("x").what()) == "BatchSizeError: x");
  BOOST_TEST(KeyError("").message() == "");
  BOOST_TEST(std::string(KeyError("").what()) == "KeyError: ");
  NotImplementedError ni("share_memory_ is not supported on a Redis store");
  BOOST_TEST(std::string(ni.what()) == "NotImplementedError: share_memory_ is not supported on a Redis store");
  BOOST_TEST((ni.code() == ErrorCode::NotImplemented));
  BOOST_TEST((error_code_of("NotImplementedError") == ErrorCode::NotImplemented));
  BOOST_CHECK_THROW(throw ni, Error);
  BOOST_CHECK_THROW(throw ni, std::runtime_error);
}

BOOST_AUTO_TEST_CASE(carry_and_rethrow_keep_type_and_message) {
  // the message itself starts with another type's prefix: carried verbatim, never parsed back
  const std::vector<std::string> messages = {"plain message", "KeyError: looks like a key error",
                                             "RuntimeError: RuntimeError: twice", "", "a: b: c"};
  for (ErrorCode c : kErrorCodes) {
    for (const auto& msg : messages) {
      BOOST_TEST_CONTEXT(error_name(c) << " / '" << msg << "'") {
        map_detail::CarriedError ce = carried([&] { throw_error(c, msg); }, 7);
        BOOST_TEST((ce.code == c));
        BOOST_TEST(ce.message == msg);
        BOOST_TEST(ce.chunk == 7);
        Caught k = caught([&] { map_detail::rethrow(ce); });
        BOOST_TEST((k.code == c));
        BOOST_TEST(k.message == msg);
        BOOST_TEST(k.what == std::string(error_name(c)) + ": " + msg);
        // a second trip changes nothing
        map_detail::CarriedError again = carried([&] { map_detail::rethrow(ce); });
        BOOST_TEST((again.code == c));
        BOOST_TEST(again.message == msg);
      }
    }
  }
  // caught as the typed class after the trip
  map_detail::CarriedError ce = carried([] { throw IndexError("KeyError: not a key error"); });
  BOOST_TEST(zoo::message_of<IndexError>([&] { map_detail::rethrow(ce); }) ==
             "IndexError: KeyError: not a key error");
  ce = carried([] { throw NotImplementedError("share_memory_"); });
  BOOST_TEST(zoo::message_of<NotImplementedError>([&] { map_detail::rethrow(ce); }) ==
             "NotImplementedError: share_memory_");
}

BOOST_AUTO_TEST_CASE(foreign_exceptions_become_runtime_errors) {
  map_detail::CarriedError ce = carried([] { throw std::out_of_range("vector::at"); }, 3);
  BOOST_TEST((ce.code == ErrorCode::Runtime));
  BOOST_TEST(ce.message == "vector::at");
  BOOST_TEST(zoo::message_of<RuntimeError>([&] { map_detail::rethrow(ce); }) == "RuntimeError: vector::at");
  // a std::exception whose what() looks like one of ours stays a RuntimeError with that text
  ce = carried([] { throw std::runtime_error("KeyError: foreign"); });
  BOOST_TEST((ce.code == ErrorCode::Runtime));
  BOOST_TEST(ce.message == "KeyError: foreign");
  BOOST_TEST(zoo::message_of<RuntimeError>([&] { map_detail::rethrow(ce); }) == "RuntimeError: KeyError: foreign");
  // not a std::exception at all
  ce = carried([] { throw 42; }, 5);
  BOOST_TEST((ce.code == ErrorCode::Runtime));
  BOOST_TEST(ce.message == "a map worker threw an exception that is not a std::exception (chunk 5)");
}

BOOST_AUTO_TEST_CASE(torch_errors_are_translated) {
  // a real libtorch IndexError: index_select out of range
  at::Tensor t = at::arange(3);
  map_detail::CarriedError ce = carried([&] { at::index_select(t, 0, at::tensor({5}, at::kLong)); });
  BOOST_TEST((ce.code == ErrorCode::Index));
  BOOST_TEST(ce.message.find("index out of range") != std::string::npos, ce.message);
  BOOST_TEST(ce.message.find("Exception raised from") == std::string::npos, ce.message);  // no backtrace
  std::string m = zoo::message_of<IndexError>([&] { map_detail::rethrow(ce); });
  BOOST_TEST(m == "IndexError: " + ce.message);
  // a plain c10::Error (cat of mismatched shapes): RuntimeError
  ce = carried([] { at::cat({at::zeros({2, 3}), at::zeros({2, 4})}, 0); });
  BOOST_TEST((ce.code == ErrorCode::Runtime));
  BOOST_TEST(ce.message.find("Sizes of tensors must match") != std::string::npos, ce.message);
  BOOST_TEST(ce.message.find("Exception raised from") == std::string::npos, ce.message);
  // torch's typed errors keep their kind
  ce = carried([] { throw c10::ValueError({__func__, __FILE__, __LINE__}, "torch value"); });
  BOOST_TEST((ce.code == ErrorCode::Value));
  BOOST_TEST(ce.message == "torch value");
  ce = carried([] { throw c10::TypeError({__func__, __FILE__, __LINE__}, "torch type"); });
  BOOST_TEST((ce.code == ErrorCode::Type));
  BOOST_TEST(ce.message == "torch type");
  ce = carried([] { throw c10::IndexError({__func__, __FILE__, __LINE__}, "torch index"); });
  BOOST_TEST((ce.code == ErrorCode::Index));
}

BOOST_AUTO_TEST_CASE(torch_errors_inside_tensordict_ops) {
  // td[long index] out of range: IndexError naming the index and the batch size
  TensorDict td({{"x", at::zeros({4, 2})}}, {4});
  Caught k = caught([&] { td.index({at::tensor({7}, at::kLong)}); });
  BOOST_TEST((k.code == ErrorCode::Index));
  BOOST_TEST(k.what.rfind("IndexError: ", 0) == 0u, k.what);
  BOOST_TEST(k.what.find("Exception raised from") == std::string::npos, k.what);
  // td[idx] = value of a shape that does not broadcast: a torch error with the key in the context
  k = caught([&] { td.index_put_({at::indexing::Slice(0, 2)}, at::zeros({3, 2})); });
  BOOST_TEST(k.what.find("td[idx] = value: cannot write a value of shape") != std::string::npos, k.what);
  BOOST_TEST(k.what.find("'x'") != std::string::npos, k.what);
  BOOST_TEST(k.what.rfind(std::string(error_name(k.code)) + ": ", 0) == 0u, k.what);
  BOOST_TEST(k.what.find("Exception raised from") == std::string::npos, k.what);
}

BOOST_AUTO_TEST_SUITE_END()
