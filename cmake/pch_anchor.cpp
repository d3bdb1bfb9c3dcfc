// The translation unit of the precompiled-header anchors td_app_pch (top-level CMakeLists.txt) and td_test_pch
// (tests/): tiny executables that exist to build the precompiled <ATen/ATen.h> (and Boost.Test) that the
// programs (examples/, bench/, api/tools/, the tests' workers) and the test executables reuse, so that each of
// them does not parse libtorch's headers again. Executables, because GCC refuses a PCH built with -fPIC (a
// library) in a -fPIE compile.
int main() { return 0; }
