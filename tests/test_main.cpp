// The Boost.Test main of every test executable (one per layer).
#define BOOST_TEST_MODULE tensordict_tests
#include <boost/test/unit_test.hpp>
