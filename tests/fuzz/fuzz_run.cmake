# One fuzz target's ctest run (tests/fuzz/CMakeLists.txt):
#   -DFUZZER=binary -DNAME=n -DWORK=dir -DSECONDS=s -DSEEDS=dir;dir;...  (GENERATED: the target writes them)
# SECONDS > 0: libFuzzer runs for that long over WORK (its growing corpus) and the seeds; 0: every seed is
# replayed once. Fails on a crash, a hang (-timeout) or a leak; prints libFuzzer's counts either way.
file(MAKE_DIRECTORY ${WORK}/corpus ${WORK}/artifacts)
set(dirs "")
foreach(d ${SEEDS})
  if(d STREQUAL "GENERATED")
    execute_process(COMMAND ${FUZZER} --write-seeds ${WORK}/seeds RESULT_VARIABLE rc)
    if(NOT rc EQUAL 0)
      message(FATAL_ERROR "${NAME}: writing the seeds failed (${rc})")
    endif()
    list(APPEND dirs ${WORK}/seeds)
  elseif(IS_DIRECTORY ${d})
    list(APPEND dirs ${d})
  endif()
endforeach()
# -timeout: one input running this long is a hang. Inputs take under 0.1 s; 120 s, not 30, because a
# paravirtualised CI machine was seen to stop running for 30-71 s at a time (the kernel's "workqueue
# lockup" reports), and libFuzzer times inputs by the wall clock: 30 s turned such pauses into
# "timeouts" whose inputs replay in 0.05 s.
if(SECONDS GREATER 0)
  execute_process(COMMAND ${FUZZER} -max_total_time=${SECONDS} -timeout=120 -rss_limit_mb=4096 -print_final_stats=1
                          -artifact_prefix=${WORK}/artifacts/ ${WORK}/corpus ${dirs}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
else()
  execute_process(COMMAND ${FUZZER} ${dirs} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
endif()
string(REGEX MATCH "stat::number_of_executed_units: [0-9]+" units "${out}")
string(LENGTH "${out}" n)
if(n GREATER 6000)
  math(EXPR start "${n} - 6000")
  string(SUBSTRING "${out}" ${start} 6000 out)
endif()
message("${out}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${NAME}: the fuzz target failed (exit ${rc}); the input is under ${WORK}/artifacts")
endif()
message("${NAME}: ok ${units}")
