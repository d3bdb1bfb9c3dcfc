// Sanitizer canaries: each mode commits one defect of the kind its sanitizer must report. The CTest tests
// sanitizers.* (registered in sanitizer builds only) pass when the report appears under the same options and
// suppression files the suites run with: proof that the sanitizer is on and that no suppression hides our code.
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

namespace {
int shared_counter = 0;  // written by two threads without synchronisation (the race)

int race() {
  std::thread a([] {
    for (int i = 0; i < 100000; ++i) ++shared_counter;
  });
  std::thread b([] {
    for (int i = 0; i < 100000; ++i) ++shared_counter;
  });
  a.join();
  b.join();
  return shared_counter > 0 ? 0 : 1;
}

char shared_text[64];  // copied into by two threads without synchronisation (a race through an interceptor)

//! the race seen only through libc's intercepted memcpy, called from our code. No suppression may hide it:
//! TSan's ignore_noninstrumented_modules=1 does (GCC's runtime, libtsan.so, is not what TSan looks for to tell
//! an instrumented module, so every module counts as uninstrumented), and so would called_from_lib of our libs
int race_memcpy() {
  const char a_text[] = "written by thread a";
  const char b_text[] = "written by thread b";
  std::thread a([&] {
    for (int i = 0; i < 10000; ++i) std::memcpy(shared_text, a_text, sizeof a_text);
  });
  std::thread b([&] {
    for (int i = 0; i < 10000; ++i) std::memcpy(shared_text, b_text, sizeof b_text);
  });
  a.join();
  b.join();
  return shared_text[0] == 'w' ? 0 : 1;
}

int overflow(int n) {
  char* p = static_cast<char*>(std::malloc(static_cast<size_t>(n)));
  std::memset(p, 1, static_cast<size_t>(n));
  const int v = p[n];  // one past the end
  std::free(p);
  return v;
}

int signed_overflow(int x) { return x + 1; }
}  // namespace

int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "";
  if (std::strcmp(mode, "race") == 0) return race();
  if (std::strcmp(mode, "race_memcpy") == 0) return race_memcpy();
  if (std::strcmp(mode, "overflow") == 0) return overflow(argc + 15);
  if (std::strcmp(mode, "ub") == 0) return signed_overflow(argc > 1 ? INT_MAX : 0) == 0 ? 0 : 3;
  std::fprintf(stderr, "usage: sanitizer_canary race|race_memcpy|overflow|ub\n");
  return 2;
}
