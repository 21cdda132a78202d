# cmake -P wrapper: runs `MPIEXEC --oversubscribe -np NP EXE MODE` and passes only if the job exits
# non-zero within MAX_SECONDS and its output matches REGEX. MPIEXEC_ARGS (optional, ;-separated):
# more mpirun options. ANY_EXIT=1: accept exit code 0 too (mpirun --enable-recovery exits 0 after a
# rank's MPI_Abort); the message and the time are still checked.
string(TIMESTAMP start "%s")
execute_process(COMMAND ${MPIEXEC} --oversubscribe ${MPIEXEC_ARGS} -np ${NP} ${EXE} ${MODE}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT ${MAX_SECONDS})
string(TIMESTAMP end "%s")
math(EXPR elapsed "${end} - ${start}")
message("exit: ${rc}, ${elapsed} s\n--- stdout\n${out}\n--- stderr\n${err}")
if(rc STREQUAL "0" AND NOT ANY_EXIT)
  message(FATAL_ERROR "expected a non-zero exit, got 0")
endif()
if(rc MATCHES "timeout|Process terminated")
  message(FATAL_ERROR "the job did not end within ${MAX_SECONDS} s: ${rc}")
endif()
if(NOT "${out}${err}" MATCHES "${REGEX}")
  message(FATAL_ERROR "the output does not match '${REGEX}'")
endif()
message("ok: non-zero exit (${rc}) in ${elapsed} s with the expected message")
