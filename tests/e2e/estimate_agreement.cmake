# The estimator agrees with a real run: trains CONFIG with its zero_optimization.stage set to STAGE on
# NP ranks (--summary), asks `zeroshard estimate --config ... --ranks NP --stage STAGE --json`, and
# requires every rank's model_states_bytes and activation peak to equal the estimate exactly and its
# device peak to equal the estimate's (one rank, or one per pipeline stage; more: the estimate within
# 0..+5% above). Prints
# "estimate agreement ok" on success.
# With -DOFFLOAD=cpu|nvme the run offloads the optimizer states (stages 1-3) and the parameters (stage 3),
# swap files in a fresh directory under WORK, and the estimate reads those keys from the config; then
# every rank's nvme_bytes must equal the estimate's nvme tier and its host_peak_bytes the host tier
# (host model states + the NVMe step's buffers; at stage 3 with NVMe parameters, up to the staging
# bound above that). The summary's model_states_bytes (in-memory buffers at their requested size) are
# not compared then.
# With -DEXACT=ON the device peak must equal the estimate on every rank (ZeRO++'s qgZ reduces on the
# calling thread, so no reduction's timing moves the peak).
# With -DSTATES_ONLY=ON only the model_states_bytes are compared (a GPT-MoE: its activations and
# device peak follow the routing, which the estimator takes as balanced).
# With -DTP=T (a config with model.tensor_parallel_size T) world rank r is compared with the estimate's
# data-parallel rank r / T.
# With -DNATIVE_THREADS=ON both run without OPENBLAS_NUM_THREADS (the test environment's 1) and the
# ranks unbound (mpirun --bind-to none): each rank computes on its share of the CPUs, and the estimate
# must measure on the same count (Note [estimate threads] in tools/estimate_command.cpp).
# With -DPP=P (a config with model.pipeline_parallel_size P) each pipeline stage is estimated on its
# own (--pp-stage S) and world rank r compared with its stage's estimate, as data-parallel rank
# (r / T) % (NP / (T x P)) of stage r / (T x dp) (comm::Topology's order: tp, then dp, then pp). -DSCHEDULE=X sets
# pipeline.schedule, -DVIRTUAL=V model.virtual_pipeline_size.
#   cmake -DTOOL=zeroshard -DMPIEXEC=mpirun -DCONFIG=cfg.json -DSTAGE=2 -DNP=3 -DWORK=dir [-DOFFLOAD=nvme] [-DTP=2]
#         [-DPP=2 [-DSCHEDULE=interleaved] [-DVIRTUAL=2]] -P estimate_agreement.cmake
file(READ ${CONFIG} text)
string(JSON text SET "${text}" zero_optimization stage ${STAGE})
if(NOT TP)
  set(TP 1)
endif()
if(NOT PP)
  set(PP 1)
endif()
set(tag_extra "")
if(DEFINED SCHEDULE)
  string(JSON text SET "${text}" pipeline schedule "\"${SCHEDULE}\"")
  set(tag_extra _${SCHEDULE})
endif()
if(DEFINED VIRTUAL)
  string(JSON text SET "${text}" model virtual_pipeline_size ${VIRTUAL})
  set(tag_extra ${tag_extra}_v${VIRTUAL})
endif()
file(MAKE_DIRECTORY ${WORK})
set(tag s${STAGE}_np${NP}_pp${PP}${tag_extra})
if(DEFINED OFFLOAD)
  set(tag ${tag}_${OFFLOAD})
  set(nvme_dir ${WORK}/nvme_${tag})
  file(REMOVE_RECURSE ${nvme_dir})
  file(MAKE_DIRECTORY ${nvme_dir})
  set(target "{\"device\": \"${OFFLOAD}\", \"nvme_path\": \"${nvme_dir}\"}")
  string(JSON text SET "${text}" zero_optimization offload_optimizer "${target}")
  if(STAGE EQUAL 3)
    string(JSON text SET "${text}" zero_optimization offload_param "${target}")
  endif()
endif()
set(cfg ${WORK}/estimate_${tag}.json)
set(summary ${WORK}/estimate_${tag}_summary.json)
file(WRITE ${cfg} "${text}")
file(REMOVE ${summary})
set(train ${TOOL} train --config ${cfg} --steps 2 --summary ${summary})
set(threads_env)
if(NATIVE_THREADS)
  set(threads_env ${CMAKE_COMMAND} -E env --unset=OPENBLAS_NUM_THREADS --unset=OMP_NUM_THREADS)
endif()
if(NP GREATER 1)
  set(bind)
  if(NATIVE_THREADS)
    set(bind --bind-to none)
  endif()
  set(train ${MPIEXEC} --oversubscribe ${bind} -np ${NP} ${train})
endif()
set(train ${threads_env} ${train})
execute_process(COMMAND ${train} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 120)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "estimate agreement: training failed (${rc}):\n${out}${err}")
endif()
math(EXPR last_pp "${PP} - 1")
foreach(s RANGE ${last_pp})
  set(pp_arg)
  if(PP GREATER 1)
    set(pp_arg --pp-stage ${s})
  endif()
  execute_process(COMMAND ${threads_env} ${TOOL} estimate --config ${cfg} --ranks ${NP} --stage ${STAGE} ${pp_arg} --json
    RESULT_VARIABLE rc OUTPUT_VARIABLE est_pp${s} ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "estimate agreement: estimate failed (${rc}): ${err}")
  endif()
endforeach()
set(est "${est_pp0}")
math(EXPR dp_size "${NP} / (${TP} * ${PP})")
file(READ ${summary} sum)
string(JSON n_ranks LENGTH "${sum}" memory per_rank)
if(NOT n_ranks EQUAL NP)
  message(FATAL_ERROR "estimate agreement: summary has ${n_ranks} ranks, expected ${NP}")
endif()
math(EXPR last_rank "${NP} - 1")
foreach(r RANGE ${last_rank})
  string(JSON rank GET "${sum}" memory per_rank ${r} rank)
  # With -DTP=T the config is tensor-parallel: the summary lists world ranks (tp ranks consecutive), the
  # estimate data-parallel ranks, each standing for its T tp ranks (slices of the same sizes); with
  # -DPP=P each pipeline stage has its own estimate.
  math(EXPR dp_rank "(${rank} / ${TP}) % ${dp_size}")
  math(EXPR pp_rank "${rank} / (${TP} * ${dp_size})")
  set(est "${est_pp${pp_rank}}")
  string(JSON n_groups LENGTH "${est}" stages 0 per_shard_size)
  string(JSON act_est GET "${est}" stages 0 transient activations_peak bytes)
  math(EXPR last_group "${n_groups} - 1")
  set(found OFF)
  foreach(g RANGE ${last_group})
    string(JSON first GET "${est}" stages 0 per_shard_size ${g} first_rank)
    string(JSON lastr GET "${est}" stages 0 per_shard_size ${g} last_rank)
    if(dp_rank GREATER_EQUAL first AND dp_rank LESS_EQUAL lastr)
      set(found ON)
      # The device arena's peak against the estimator's measurement (the engine's own code over the
      # measuring backend, estimate/measure.h): byte for byte on one rank; with more, reductions that
      # finish early can only lower the run's peak, so the prediction is within [0, +5%] of it.
      string(JSON peak_est GET "${est}" stages 0 per_shard_size ${g} device_peak bytes)
      string(JSON peak_got GET "${sum}" memory per_rank ${r} device_peak_bytes)
      set(lo ${peak_got})
      if(NP EQUAL 1 OR EXACT OR (PP GREATER 1 AND dp_size EQUAL 1))  # one rank per pipeline stage: exact too
        set(hi ${peak_got})
      else()
        math(EXPR hi "${peak_got} * 105 / 100")
      endif()
      if(NOT STATES_ONLY AND (peak_est LESS lo OR peak_est GREATER hi))
        string(JSON peak_at GET "${est}" stages 0 per_shard_size ${g} device_peak formula)
        message(FATAL_ERROR "estimate agreement: stage ${STAGE} rank ${rank} device peak: run ${peak_got} bytes, "
                            "estimate ${peak_est} (allowed ${lo}..${hi}); estimate ${peak_at}")
      endif()
      message(STATUS "rank ${rank} (pipeline stage ${pp_rank}): device peak ${peak_got}, estimate ${peak_est}")
      if(DEFINED OFFLOAD)
        string(JSON want_nvme GET "${est}" stages 0 per_shard_size ${g} tiers nvme)
        string(JSON want_host GET "${est}" stages 0 per_shard_size ${g} tiers host)
        string(JSON got_nvme GET "${sum}" memory per_rank ${r} nvme_bytes)
        string(JSON got_host GET "${sum}" memory per_rank ${r} host_peak_bytes)
        if(NOT got_nvme EQUAL want_nvme)
          message(FATAL_ERROR "estimate agreement: stage ${STAGE} ${OFFLOAD} rank ${rank} nvme: run ${got_nvme} bytes, estimate ${want_nvme}")
        endif()
        string(JSON staging TYPE "${est}" stages 0 transient nvme_param_staging)
        set(slack 0)
        if(staging STREQUAL "OBJECT")
          string(JSON slack GET "${est}" stages 0 transient nvme_param_staging bytes)
        endif()
        math(EXPR host_max "${want_host} + ${slack}")
        if(got_host LESS want_host OR got_host GREATER host_max)
          message(FATAL_ERROR "estimate agreement: stage ${STAGE} ${OFFLOAD} rank ${rank} host peak: run ${got_host} bytes, "
                              "estimate ${want_host} (+ up to ${slack} of NVMe staging)")
        endif()
        message(STATUS "rank ${rank}: nvme ${got_nvme} = ${want_nvme}, host peak ${got_host} in [${want_host}, ${host_max}]")
      else()
        foreach(cat params grads optimizer)
          string(JSON want GET "${est}" stages 0 per_shard_size ${g} model_states_bytes ${cat})
          string(JSON got GET "${sum}" memory per_rank ${r} model_states_bytes ${cat})
          if(NOT got EQUAL want)
            message(FATAL_ERROR "estimate agreement: stage ${STAGE} rank ${rank} ${cat}: run ${got} bytes, estimate ${want}")
          endif()
        endforeach()
      endif()
    endif()
  endforeach()
  if(NOT found)
    message(FATAL_ERROR "estimate agreement: rank ${rank} missing from the estimate")
  endif()
  # Activations do not depend on communication: measured on rank 0, they are every rank's, exactly.
  string(JSON act GET "${sum}" memory per_rank ${r} activation_peak_bytes)
  if(NOT STATES_ONLY AND NOT act EQUAL act_est)
    message(FATAL_ERROR "estimate agreement: rank ${rank} activation peak ${act} bytes vs estimate ${act_est}")
  endif()
endforeach()
if(NOT DEFINED OFFLOAD)
  set(OFFLOAD none)
endif()
message(STATUS "estimate agreement ok: stage ${STAGE}, ${NP} rank(s), pp ${PP}, offload ${OFFLOAD}, ${n_groups} shard size(s)")
