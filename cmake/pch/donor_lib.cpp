// Compiled only to build the precompiled header the libraries reuse (cmake/pch/common.h).
