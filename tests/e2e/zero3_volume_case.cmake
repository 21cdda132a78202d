# ZeRO-3's 3 Psi end to end (cmake -P): `zeroshard train` at stage 3 with every module released after
# its use (stage3_max_reuse_distance 0: none kept from the forward for the backward;
# stage3_param_persistence_threshold 0: none kept gathered) sends, per rank and step, exactly three
# collectives of the whole model: the forward's gather, the backward's gather and the gradients'
# reduce-scatter, each (N-1)/N Psi elements of 4 bytes (CommCounters' rule, comm/config.h: total - own;
# Psi = params_total, which N divides here). The summary's comm.ops (rank 0's tallies per collective)
# must give allgatherv 2 S (N-1)/N Psi 4 bytes and reduce_scatter S (N-1)/N Psi 4 bytes over S steps,
# exact_gradient_mean the reduce-scatter's share of a step, and exact_mean that 3 (N-1)/N Psi 4 plus
# no more than the run's scalar collectives (the loss's and the gradient norm's allreduces). The
# reduce-scatters' busiest_bytes (Note [Busiest member's bytes]) lie above this rank's own bytes, since a
# gradient bucket is a range of the flat layout that the contiguous shards split unevenly, and at most at
# every call's total, S Psi 4 bytes. (The gathers' are printed: on one host with the shared arena they
# are one-sided reads of the peers' shards, Note [one-sided parameter gathers], tallied at their own.)
#   -DMPIEXEC=... -DTOOL=... -DCONFIG=... -DNP=2 -DOUT=dir
set(summary ${OUT}/zero3_volume_np${NP}.json)
file(REMOVE ${summary})
execute_process(COMMAND ${MPIEXEC} --oversubscribe -np ${NP} ${TOOL} train --config ${CONFIG} --summary ${summary}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 120)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "exit ${rc}\n${out}\n${err}")
endif()
file(READ ${summary} s)
string(JSON psi GET "${s}" params_total)
string(JSON steps GET "${s}" steps)
string(JSON gathered GET "${s}" comm ops allgatherv bytes_sent)
string(JSON scattered GET "${s}" comm ops reduce_scatter bytes_sent)
string(JSON small GET "${s}" comm ops allreduce bytes_sent)
string(JSON busiest_gathered GET "${s}" comm ops allgatherv busiest_bytes)
string(JSON busiest GET "${s}" comm ops reduce_scatter busiest_bytes)
string(JSON grad_mean GET "${s}" comm per_rank 0 bytes_sent_per_step exact_gradient_mean)
string(JSON step_mean GET "${s}" comm per_rank 0 bytes_sent_per_step exact_mean)
math(EXPR rest "${psi} % ${NP}")
if(NOT rest EQUAL 0)
  message(FATAL_ERROR "params_total ${psi} is not divisible by ${NP}: the formula below assumes even shards")
endif()
math(EXPR one "(${NP} - 1) * (${psi} / ${NP}) * 4")  # one collective of the whole model, bytes per rank
math(EXPR want_gathered "2 * ${steps} * ${one}")
math(EXPR want_scattered "${steps} * ${one}")
math(EXPR three "3 * ${one}")
string(REGEX REPLACE "\\..*" "" step_floor "${step_mean}")
string(REGEX REPLACE "\\.0*$" "" grad_int "${grad_mean}")
math(EXPR extra "${step_floor} - ${three}")
message(STATUS "Psi ${psi}, ${steps} steps, np ${NP}: allgatherv ${gathered} B (want ${want_gathered}), reduce_scatter "
               "${scattered} B (want ${want_scattered}); per step ${step_mean} B = 3 x ${one} + ${extra} (scalar allreduces, "
               "${small} B in the run)")
if(NOT gathered EQUAL want_gathered OR NOT scattered EQUAL want_scattered)
  message(FATAL_ERROR "the gathers or the reduce-scatters are not ZeRO-3's volume (above)")
endif()
if(NOT grad_int STREQUAL "${one}")
  message(FATAL_ERROR "exact_gradient_mean ${grad_mean} is not one collective of the model, ${one} bytes")
endif()
if(extra LESS 0 OR extra GREATER small)
  message(FATAL_ERROR "exact_mean ${step_mean} is not 3 x ${one} plus the scalar allreduces (${small} B)")
endif()
math(EXPR busiest_most "${steps} * ${psi} * 4")
message(STATUS "reduce_scatter busiest_bytes ${busiest} B: above the own ${scattered} B, at most the calls' total "
               "${busiest_most} B; allgatherv busiest_bytes ${busiest_gathered} B")
if(NOT busiest GREATER scattered OR busiest GREATER busiest_most)
  message(FATAL_ERROR "the reduce-scatters' busiest_bytes ${busiest} is not above this rank's own ${scattered} B and at "
                      "most ${busiest_most} B (contiguous shards split a bucket unevenly: docs/scaling.md, \"Uneven blocks\")")
endif()
