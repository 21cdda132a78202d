// The test executables' precompiled header: the common one and GoogleTest (cmake/pch/common.h).
#pragma once

#include "common.h"

#include <gtest/gtest.h>
