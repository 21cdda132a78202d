# cmake -P driver: runs a command once and checks the run output that README.md and docs/ quote from
# it (blocks marked `<!-- output of NAME -->`, doc_output_check.cpp), so a quoted figure cannot drift
# from what the program prints.
#   -DCOMMAND=a|b|c       the command line, arguments separated by '|'
#   -DNAME=n              the marker name the quoted blocks carry
#   -DCHECKER=exe -DROOT=source dir -DOUT=file (the run's stdout and stderr, kept for a look)
#   -DTOLERANCE=r         optional: figures agree within r relative (default the checker's 0.1%)
#   -DSET_JSON=in|out|key...|value   optional: writes `in` with one JSON value replaced to `out` first
#                         (the docs' `jq '.zero_optimization.stage = 0'`)
cmake_minimum_required(VERSION 3.25)
if(DEFINED SET_JSON)
  string(REPLACE "|" ";" set_args "${SET_JSON}")
  list(POP_FRONT set_args in out)
  file(READ ${in} text)
  string(JSON text SET "${text}" ${set_args})
  file(WRITE ${out} "${text}")
endif()
string(REPLACE "|" ";" argv "${COMMAND}")
execute_process(COMMAND ${argv} WORKING_DIRECTORY ${ROOT} RESULT_VARIABLE rc OUTPUT_VARIABLE log ERROR_VARIABLE log)
file(WRITE ${OUT} "${log}")
list(JOIN argv " " shown)
message("$ ${shown}\nexit ${rc}\n${log}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the run exited ${rc}")
endif()
execute_process(COMMAND ${CHECKER} ${ROOT} ${NAME} ${OUT} ${TOLERANCE} RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the docs quote output this run does not print (above)")
endif()
