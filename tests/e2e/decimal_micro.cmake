# _zs_micro(out text): millionths of a plain decimal such as a logged loss ("3.601234" -> 3601234),
# so the e2e scripts can compare losses with CMake's integer-only math. Included by checkpoint_case.cmake
# and moe_case.cmake.
function(_zs_micro out text)
  if(NOT text MATCHES "^([0-9]+)\\.([0-9]*)$")
    message(FATAL_ERROR "loss '${text}' is not a plain decimal")
  endif()
  string(SUBSTRING "${CMAKE_MATCH_2}000000" 0 6 frac)
  math(EXPR v "${CMAKE_MATCH_1} * 1000000 + 1${frac} - 1000000")
  set(${out} ${v} PARENT_SCOPE)
endfunction()
