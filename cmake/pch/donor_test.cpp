// Compiled only to build the precompiled header the test executables reuse (cmake/pch/test.h).
int main() { return 0; }
