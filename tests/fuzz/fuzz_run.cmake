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
# A "timeout" whose input replays at once was the machine, not the input: this VM was seen to stop for
# over 100 s (kernel "workqueue lockup ... stuck for 103s"), longer than -timeout, while an input that
# replays in 0.07 s was running. So a timeout's input is run again, alone, for up to 60 s: a real hang
# (or a crash) still fails, a replay within 10 s passes with a note. Crashes and leaks fail as before.
if(NOT rc EQUAL 0 AND out MATCHES "libFuzzer: timeout" AND out MATCHES "Test unit written to ([^\n]+)")
  set(input "${CMAKE_MATCH_1}")
  string(TIMESTAMP t0 "%s" UTC)
  execute_process(COMMAND ${FUZZER} ${input} TIMEOUT 60 RESULT_VARIABLE replay_rc OUTPUT_QUIET ERROR_QUIET)
  string(TIMESTAMP t1 "%s" UTC)
  math(EXPR took "${t1} - ${t0}")
  if(replay_rc EQUAL 0 AND took LESS 10)
    message("${NAME}: libFuzzer's timeout was the machine stalling, not the input: ${input} replays in ${took} s")
    set(rc 0)
  else()
    message("${NAME}: the timeout's input replays as a hang or a failure (${replay_rc}, ${took} s)")
  endif()
endif()
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${NAME}: the fuzz target failed (exit ${rc}); the input is under ${WORK}/artifacts")
endif()
message("${NAME}: ok ${units}")
