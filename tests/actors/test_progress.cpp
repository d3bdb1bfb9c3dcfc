// map progress lines: count, percentage, elapsed time, rate and ETA (upstream shows a tqdm bar).
#include <boost/test/unit_test.hpp>

#include "tensordict/actors/progress.hpp"

using tensordict::actors::progress_text;

BOOST_AUTO_TEST_SUITE(progress)

BOOST_AUTO_TEST_CASE(log_line_has_rate_and_eta) {
  BOOST_TEST(progress_text("map", 10, 40, 2.0, 0) == "map: 10/40 chunks (25%), 2.0s, 5.00 chunks/s, ETA 6.0s");
  BOOST_TEST(progress_text("map", 40, 40, 0.5, 0) == "map: 40/40 chunks (100%), 0.5s, 80.00 chunks/s, ETA 0.0s");
  BOOST_TEST(progress_text("map", 3000, 6000, 1.0, 0) == "map: 3000/6000 chunks (50%), 1.0s, 3000 chunks/s, ETA 1.0s");
}

BOOST_AUTO_TEST_CASE(nothing_done_yet_has_no_rate) {
  BOOST_TEST(progress_text("map", 0, 8, 0.0, 0) == "map: 0/8 chunks (0%), 0.0s, - chunks/s, ETA -");
  BOOST_TEST(progress_text("map", 0, 0, 0.0, 0) == "map: 0/0 chunks (100%), 0.0s, - chunks/s, ETA 0.0s");
}

BOOST_AUTO_TEST_CASE(bar_form) {
  BOOST_TEST(progress_text("map", 5, 10, 1.0, 10) == "map [#####-----] 5/10 chunks 1.0s, 5.00 chunks/s, ETA 1.0s");
}

BOOST_AUTO_TEST_SUITE_END()
