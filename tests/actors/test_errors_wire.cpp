// Errors on the wire: map_error (map workers, worker processes) and store_response carry the ErrorCode and
// the bare message through CAF's binary serialisation (what the middleman sends) and back.
#include <vector>

#include <boost/test/unit_test.hpp>
#include <caf/binary_deserializer.hpp>
#include <caf/binary_serializer.hpp>

#include "tensordict/actors/messages.hpp"
#include "tensordict/errors.hpp"
#include "tensordict/map.hpp"

using namespace tensordict;
using actors::map_error;
using actors::store_response;

namespace {

//! x serialised and read back, as a remote actor receives it
template <class T>
T through_the_wire(T x) {
  std::vector<char> buf;
  caf::binary_serializer sink{nullptr, buf};
  auto err = sink(x);
  BOOST_TEST_REQUIRE(!err);
  T y;
  caf::binary_deserializer source{nullptr, buf};
  err = source(y);
  BOOST_TEST_REQUIRE(!err);
  return y;
}

//! the Error that rethrowing ce throws: (code, what())
std::pair<ErrorCode, std::string> rethrown(const map_detail::CarriedError& ce) {
  try {
    map_detail::rethrow(ce);
  } catch (const Error& e) {
    return {e.code(), e.what()};
  }
}

}  // namespace

BOOST_AUTO_TEST_SUITE(errors_wire)

BOOST_AUTO_TEST_CASE(map_error_round_trips_every_code) {
  for (ErrorCode c : kErrorCodes) {
    for (std::string msg : {"bare", "KeyError: prefixed by another type", ""}) {
      BOOST_TEST_CONTEXT(error_name(c) << " / '" << msg << "'") {
        map_detail::CarriedError ce;
        try {
          throw_error(c, msg);
        } catch (...) {
          ce = map_detail::carry_current_exception(11);
        }
        map_error w = through_the_wire(actors::to_wire(ce));
        BOOST_TEST(w.code == static_cast<int32_t>(c));
        BOOST_TEST(w.message == msg);
        BOOST_TEST(w.chunk == 11);
        map_detail::CarriedError back = actors::from_wire(w);
        BOOST_TEST((back.code == c));
        BOOST_TEST(back.message == msg);
        auto r = rethrown(back);
        BOOST_TEST((r.first == c));
        BOOST_TEST(r.second == std::string(error_name(c)) + ": " + msg);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(unknown_code_on_the_wire_is_runtime_error) {
  map_error w;
  w.code = 12345;
  w.message = "from a newer peer";
  map_detail::CarriedError back = actors::from_wire(through_the_wire(w));
  BOOST_TEST((back.code == ErrorCode::Runtime));
  auto r = rethrown(back);
  BOOST_TEST((r.first == ErrorCode::Runtime));
  BOOST_TEST(r.second == "RuntimeError: from a newer peer");
  BOOST_TEST((actors::from_wire(map_error{}).code == ErrorCode::Runtime));  // the default
}

BOOST_AUTO_TEST_CASE(store_response_carries_the_error) {
  store_response r;
  r.ok = false;
  r.error = actors::to_wire({ErrorCode::NotImplemented, "ValueError: not a value error", -1});
  store_response got = through_the_wire(r);
  BOOST_TEST(!got.ok);
  auto e = rethrown(actors::from_wire(got.error));
  BOOST_TEST((e.first == ErrorCode::NotImplemented));
  BOOST_TEST(e.second == "NotImplementedError: ValueError: not a value error");
}

BOOST_AUTO_TEST_SUITE_END()
