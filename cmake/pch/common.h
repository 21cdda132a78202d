// The standard and third-party headers most of zeroshard's sources include, precompiled once per build
// (cmake/ZeroshardHelpers.cmake, ZS_PCH; Note [Precompiled headers] there). Only headers whose meaning
// does not depend on the project's own macros belong here; the project's headers do not (a change to
// one would rebuild every source).
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>
