# The GPT-MoE end to end (cmake -P): trains CONFIG_EP4 (experts spread over 4 ranks, ZeRO-3) at np 4,
# and CONFIG_EP1 (every rank holds every expert) at NP_EP1 ranks (4 by default): the loss falls, the
# summary carries the routing figures, and the two runs' losses agree step for step to 5e-5 absolute
# (about 1e-5 relative: expert parallelism moves tokens; only the order of fp32 sums changes).
#   -DMPIEXEC=... -DTOOL=... -DCONFIG_EP4=... -DCONFIG_EP1=... [-DNP_EP1=n] -DOUT=dir -DNAME=prefix
#   [-DDOC_CHECKER=exe -DDOC_ROOT=dir -DDOC_NAME=n]: also check the docs' quotes of the ep_size 4 run's
#   output (blocks marked `<!-- output of n -->`, tests/docs/doc_output_check.cpp), reusing the run
include(${CMAKE_CURRENT_LIST_DIR}/check_summary.cmake)
if(NOT NP_EP1)
  set(NP_EP1 4)
endif()
set(NP_EP4 4)
set(losses "")
foreach(ep 4 1)
  set(summary ${OUT}/${NAME}_ep${ep}.json)
  file(REMOVE ${summary})
  execute_process(COMMAND ${MPIEXEC} --oversubscribe -np ${NP_EP${ep}} ${TOOL} train --config ${CONFIG_EP${ep}} --summary ${summary}
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 240)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "ep_size ${ep}: exit ${rc}\n${out}\n${err}")
  endif()
  if(NOT err MATCHES "moe: 2 MoE layer.s. .every 2 block.s.. of 8 experts, top-2")
    message(FATAL_ERROR "ep_size ${ep}: no MoE model line\n${err}")
  endif()
  if(NOT err MATCHES "  moe: l_aux [0-9.]+ \\| dropped [0-9.]+% \\| expert tokens min [0-9]+ max [1-9][0-9]* \\| all-to-all [0-9.]+ MiB")
    message(FATAL_ERROR "ep_size ${ep}: no routing line\n${err}")
  endif()
  if(ep EQUAL 4 AND DEFINED DOC_CHECKER)
    file(WRITE ${OUT}/${NAME}_ep4_output.txt "${err}")
    execute_process(COMMAND ${DOC_CHECKER} ${DOC_ROOT} ${DOC_NAME} ${OUT}/${NAME}_ep4_output.txt RESULT_VARIABLE doc_rc)
    if(NOT doc_rc EQUAL 0)
      message(FATAL_ERROR "ep_size 4: the docs quote output this run does not print (above)")
    endif()
  endif()
  zs_check_summary(${summary} ${NP_EP${ep}})
  file(READ ${summary} s)
  string(JSON moe_max GET "${s}" moe expert_tokens_max)
  string(JSON moe_bytes GET "${s}" moe alltoall_bytes_rank0)
  # At ep_size 1 every rank holds every expert: nothing crosses ranks.
  if(moe_max LESS 1 OR (ep EQUAL 4 AND moe_bytes LESS 1) OR (ep EQUAL 1 AND NOT moe_bytes EQUAL 0))
    message(FATAL_ERROR "ep_size ${ep}: summary moe figures: most loaded expert ${moe_max} tokens, ${moe_bytes} bytes")
  endif()
  string(JSON history GET "${s}" loss_history)
  list(APPEND losses "${history}")
endforeach()
list(GET losses 0 ep4)
list(GET losses 1 ep1)
# fp32 sums of expert outputs run in another order when experts live on other ranks: equal to 1e-5
# (as the issue's equivalence bound), compared in millionths (CMake has integer math only).
# With gradient clipping on (these configs) the bound is a smoke check, not a proof: the clip
# coefficient comes from per-rank fp32 squared-norm parts, partitioned differently at ep_size 4 and 1,
# and an ulp there grows under Adam (7.6e-5 by step 19 on one version of the built-in corpus, 2e-7
# on another; docs/design.md, "Direct collectives", Numerics).
include(${CMAKE_CURRENT_LIST_DIR}/decimal_micro.cmake)
string(JSON n LENGTH "${ep4}")
math(EXPR last "${n} - 1")
foreach(i RANGE ${last})
  string(JSON a GET "${ep4}" ${i})
  string(JSON b GET "${ep1}" ${i})
  _zs_micro(ma "${a}")
  _zs_micro(mb "${b}")
  math(EXPR d "${ma} - ${mb}")
  if(d LESS -50 OR d GREATER 50)
    message(FATAL_ERROR "ep_size 4 and 1 trained differently at step ${i}: ${a} vs ${b}")
  endif()
endforeach()
message(STATUS "ep_size 4 and 1: the same ${n} losses (within 5e-5)")
