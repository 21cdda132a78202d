# `zeroshard estimate` end to end (included by tests/e2e/CMakeLists.txt, which defines zs_e2e, tool,
# ZS_BAD and one_error): the table and JSON, every error with one clear message, and agreement with
# real runs at every ZeRO stage on 1, 2 and 3 ranks (tests/e2e/estimate_agreement.cmake).
set(est_cfg ${PROJECT_SOURCE_DIR}/tests/configs/estimate_tiny.json)
# Stage 3 with offload_optimizer and offload_param on NVMe (a nvme_path that does not exist: the
# estimator never touches the disk), sub_group_size 32768, buffer_count 3.
set(est_offload_cfg ${PROJECT_SOURCE_DIR}/tests/configs/estimate_offload.json)

# ---- output --------------------------------------------------------------------------------------
zs_e2e(NAME estimate_params_table EXPECT pass
  REGEX "3 +0-3 +375,000,000 +715.3 MiB +715.3 MiB +4.19 GiB +5.59 GiB.*stage 1: 4Ψ \\+ 12Ψ/R.*optimizer = \\(4 fp32 master \\+ 8 AdamW states\\) = 12 x S_r"
  COMMAND ${tool} estimate --params 1.5B --ranks 4)
zs_e2e(NAME estimate_params_fp32_json EXPECT pass
  REGEX "\"flat_elements\":125000000,.*\"stage\":2,.*\"first_rank\":0,\"last_rank\":6,\"shard_elements\":15625024,\"model_states_bytes\":{\"params\":500000000,\"grads\":62500096,\"optimizer\":125000192"
  COMMAND ${tool} estimate --params 1.25e8 --ranks 8 --stage 2 --dtype fp32 --json)
zs_e2e(NAME estimate_uneven_shards EXPECT pass
  REGEX "3 +0-1 +352 .*3 +2 +320 "
  COMMAND ${tool} estimate --params 1000 --ranks 3 --stage 3)
zs_e2e(NAME estimate_config EXPECT pass
  REGEX "exact layout.*0\\* +0-1 +15,392..15,424 .*device peak per rank .measured.*stage 0 ranks 0-1 .*fits device.memory_mb.*stage 3 ranks 1 .*activations peak"
  COMMAND ${tool} estimate --config ${est_cfg} --ranks 2)
zs_e2e(NAME estimate_config_without_model EXPECT pass REGEX "fp16.*16Ψ/R"
  COMMAND ${tool} estimate --config ${ZS_BAD}/estimate_no_model.json --params 7B --ranks 8)

# ---- offload (ZeRO-Offload / ZeRO-Infinity) ---------------------------------------------------------
# 1.5B bf16 on 4 ranks, stage 3 on the host: 2 + 2 + 12 bytes per element of the 375M shard, none left
# on the device.
zs_e2e(NAME estimate_params_offload_cpu EXPECT pass
  REGEX "by tier.*3 +0-3 +375,000,000 device +0 B +0 B +0 B +0 B +0 B\n +host +715.3 MiB +715.3 MiB +4.19 GiB +5.59 GiB"
  COMMAND ${tool} estimate --params 1.5B --ranks 4 --stage 3 --offload cpu)
# --params with --offload nvme: DeepSpeed's defaults (sub_group_size 1e9, buffer_count 4): the
# sub-group is capped at S_r / 4 = 93,782,016 elements, 4 buffers of 4n + 4n + 4n + 2n.
zs_e2e(NAME estimate_params_offload_nvme EXPECT pass
  REGEX "3 +0-3 +375,000,000 device.*nvme +715.3 MiB +0 B +4.19 GiB +4.89 GiB.*buffers +4.89 GiB.*stage 3 ranks 0-3 +4.89 GiB  = min.B 4, G 4. x 1,312,948,224 B"
  COMMAND ${tool} estimate --params 1.5B --ranks 4 --offload nvme)
# The config's offload keys (stage 3, both on NVMe), in JSON: rank 0's shard of 15,424 elements has
# its bf16 parameters (30,848 B -> 32,768) and fp32 master + 2 moments (61,696 B -> 65,536 each) in
# swap-file regions, its gradient shard on the host, and one step buffer of all four (G 1 < B 3).
zs_e2e(NAME estimate_config_offload_nvme_json EXPECT pass
  REGEX "\"offload\":{\"optimizer\":\"nvme\",\"param\":\"nvme\"}.*\"stage\":3,\"offload\":{\"optimizer\":\"nvme\",\"param\":\"nvme\"},\"master_bytes_per_element\":4,\"per_shard_size\":.{\"first_rank\":0,\"last_rank\":0,\"shard_elements\":15424,\"model_states_bytes\":{\"params\":0,\"grads\":0,\"optimizer\":0,\"total\":0},\"by_tier\":{\"device\":{[^}]*},\"host\":{\"params\":0,\"grads\":32768,\"optimizer\":0,\"total\":32768},\"nvme\":{\"params\":32768,\"grads\":0,\"optimizer\":196608,\"total\":229376}},\"host_offload_buffers\":{\"bytes\":229376,\"formula\":\"min.B 3, G 1.*\"nvme_param_staging\":{\"bytes\":[0-9]+"
  COMMAND ${tool} estimate --config ${est_offload_cfg} --ranks 2 --offload nvme --json)
# Without --offload the config's keys apply (the same figures); --offload none overrides them.
zs_e2e(NAME estimate_config_offload_from_config EXPECT pass
  REGEX "offload optimizer nvme .stages 1-3., params nvme .stage 3.*3\\* +0 +15,424 device.*nvme +32.0 KiB +0 B +192.0 KiB"
  COMMAND ${tool} estimate --config ${est_offload_cfg} --ranks 2 --stage 3)
zs_e2e(NAME estimate_config_offload_overridden EXPECT pass
  REGEX "offload none.*model states per rank .device arena.:"
  COMMAND ${tool} estimate --config ${est_offload_cfg} --ranks 2 --offload none)

# Pipeline parallelism (gpt_tiny_pp.json, pp 2, 1F1B): every stage, each with its own parameters and
# micro-batches in flight (stage i holds pp - i), then the largest as the figure.
set(est_pp_cfg ${PROJECT_SOURCE_DIR}/examples/configs/gpt_tiny_pp.json)
zs_e2e(NAME estimate_pp EXPECT pass
  REGEX "== pipeline stage 0 of 2 ==.*pipeline stage 0 of 2 .1f1b, 4 micro-batches per step; over 1 data-parallel ranks.: [0-9,]+ parameters on this stage.*1f1b schedule: 2 of 4 micro-batches in flight.*== pipeline stage 1 of 2 ==.*1f1b schedule: 1 of 4 micro-batches in flight.*largest pipeline stage.*ZeRO stage 1: pipeline stage 0, device peak"
  COMMAND ${tool} estimate --config ${est_pp_cfg} --ranks 2)

# ---- errors: one message each, non-zero exit -----------------------------------------------------
# (test name, the message, the arguments separated by commas)
set(est_errors
  params_zero      "--params: '0' is zero"                  "--params,0"
  params_garbage   "--params: '12x' is not a number"        "--params,12x"
  params_fraction  "--params: '2.5' is not a whole number"  "--params,2.5"
  stage_five       "--stage: '5' is not a ZeRO stage"       "--params,1000,--stage,5"
  ranks_zero       "--ranks: must be at least 1, got 0"     "--params,1000,--ranks,0"
  dtype            "--dtype: 'fp8' is not a compute dtype"  "--params,1000,--dtype,fp8"
  offload_stage0   "--offload cpu: offload needs ZeRO stage 1, 2 or 3" "--params,1000,--stage,0,--offload,cpu"
  offload_target   "--offload: 'disk' is not an offload target" "--params,1000,--offload,disk"
  offload_onebit   "--offload nvme: OneBitAdam keeps whole-model momentum" "--config,${ZS_BAD}/estimate_onebit.json,--offload,nvme"
  no_model         "estimate: give the model size with --params N" ""
  config_no_model  "model: the config has no model section" "--config,${ZS_BAD}/estimate_no_model.json"
  config_and_params "--params: the config's model section already gives the model" "--config,${est_cfg},--params,1000"
  config_missing   "cannot"                                 "--config,/nonexistent/zeroshard-e2e/none.json"
  pp_stage_range   "--pp-stage: '2' is not a pipeline stage of model.pipeline_parallel_size 2" "--config,${est_pp_cfg},--ranks,2,--pp-stage,2"
  pp_stage_no_pp   "--pp-stage 0: the config has no pipeline" "--config,${est_cfg},--pp-stage,0"
  pp_zero3         "zero_optimization.stage: 3 with model.pipeline_parallel_size 2 is not supported" "--config,${est_pp_cfg},--ranks,2,--stage,3")
list(LENGTH est_errors n)
math(EXPR last "${n} - 1")
foreach(i RANGE 0 ${last} 3)
  math(EXPR j "${i} + 1")
  math(EXPR k "${i} + 2")
  list(GET est_errors ${i} case)
  list(GET est_errors ${j} regex)
  list(GET est_errors ${k} args)
  string(REPLACE "," ";" args "${args}")  # the arguments are comma-separated inside the table
  string(REPLACE "." "\\." regex "${regex}")
  zs_e2e(NAME estimate_bad_${case} EXPECT fail REGEX "zeroshard: error: ${regex}" ONCE "${one_error}"
    COMMAND ${tool} estimate ${args})
endforeach()

# ---- agreement with real runs ----------------------------------------------------------------------
foreach(stage 0 1 2 3)
  foreach(np 1 2 3)
    set(name e2e_estimate_agrees_stage${stage}.np${np})
    add_test(NAME ${name} COMMAND ${CMAKE_COMMAND} -DTOOL=$<TARGET_FILE:zeroshard> -DMPIEXEC=${MPIEXEC_EXECUTABLE}
      -DCONFIG=${est_cfg} -DSTAGE=${stage} -DNP=${np} -DWORK=${CMAKE_CURRENT_BINARY_DIR}/estimate
      -P ${CMAKE_CURRENT_SOURCE_DIR}/estimate_agreement.cmake)
    set_tests_properties(${name} PROPERTIES LABELS e2e TIMEOUT 150 ENVIRONMENT "${ZS_MPI_ENV}" PROCESSORS ${np}
      PASS_REGULAR_EXPRESSION "estimate agreement ok")
  endforeach()
endforeach()
# ... at dp 2 x tp 2 with sequence parallelism: every world rank against the estimate of its
# data-parallel rank (one tp rank's slices; the estimator counts TP shards and their activations).
foreach(stage 1 3)
  set(name e2e_estimate_agrees_tp2_stage${stage}.np4)
  add_test(NAME ${name} COMMAND ${CMAKE_COMMAND} -DTOOL=$<TARGET_FILE:zeroshard> -DMPIEXEC=${MPIEXEC_EXECUTABLE}
    -DCONFIG=${PROJECT_SOURCE_DIR}/tests/configs/estimate_tp.json -DSTAGE=${stage} -DNP=4 -DTP=2
    -DWORK=${CMAKE_CURRENT_BINARY_DIR}/estimate_tp -P ${CMAKE_CURRENT_SOURCE_DIR}/estimate_agreement.cmake)
  set_tests_properties(${name} PROPERTIES LABELS e2e TIMEOUT 150 ENVIRONMENT "${ZS_MPI_ENV}" PROCESSORS 4
    PASS_REGULAR_EXPRESSION "estimate agreement ok")
endforeach()
# ... with pipeline parallelism (examples/configs/gpt_tiny_pp.json, pp 2, 4 micro-batches per step):
# every world rank against its stage's estimate (--pp-stage), byte for byte at one rank per stage (np
# 2), under 1F1B (stage i holds pp - i micro-batches) and all-forward-all-backward (all 4), at ZeRO 1
# and 2 (the stage's whole gradient staged), ZB-H1 (deferred weight gradients) and interleaved (2 virtual
# chunks); and pp 2 x dp 2 at np 4.
foreach(case "1;2;1f1b;1" "2;2;1f1b;1" "1;2;afab;1" "2;2;zb-h1;1" "1;2;interleaved;2" "1;4;1f1b;1")
  list(GET case 0 stage)
  list(GET case 1 np)
  list(GET case 2 schedule)
  list(GET case 3 virtual)
  set(name e2e_estimate_agrees_pp2_${schedule}_stage${stage}.np${np})
  add_test(NAME ${name} COMMAND ${CMAKE_COMMAND} -DTOOL=$<TARGET_FILE:zeroshard> -DMPIEXEC=${MPIEXEC_EXECUTABLE}
    -DCONFIG=${PROJECT_SOURCE_DIR}/examples/configs/gpt_tiny_pp.json -DSTAGE=${stage} -DNP=${np} -DPP=2
    -DSCHEDULE=${schedule} -DVIRTUAL=${virtual} -DWORK=${CMAKE_CURRENT_BINARY_DIR}/estimate_pp
    -P ${CMAKE_CURRENT_SOURCE_DIR}/estimate_agreement.cmake)
  set_tests_properties(${name} PROPERTIES LABELS e2e TIMEOUT 150 ENVIRONMENT "${ZS_MPI_ENV}" PROCESSORS ${np}
    PASS_REGULAR_EXPRESSION "estimate agreement ok")
endforeach()
# ... ZB-H1 where a stage's peak falls in an attention backward (tests/configs/estimate_pp_zbh1.json,
# pp_bench.py's memory model) with the ranks' own thread counts (NATIVE_THREADS): the fused
# attention's scratch is per compute thread, so the estimate measures on the threads a rank of the
# run gets (Note [estimate threads] in tools/estimate_command.cpp; on all of its process's CPUs it
# was one thread's scratch, 16,128 bytes of the peak, too high on 2 CPUs).
add_test(NAME e2e_estimate_agrees_pp2_zb-h1_attention_peak.np2 COMMAND ${CMAKE_COMMAND} -DTOOL=$<TARGET_FILE:zeroshard>
  -DMPIEXEC=${MPIEXEC_EXECUTABLE} -DCONFIG=${PROJECT_SOURCE_DIR}/tests/configs/estimate_pp_zbh1.json -DSTAGE=1 -DNP=2
  -DPP=2 -DNATIVE_THREADS=ON -DWORK=${CMAKE_CURRENT_BINARY_DIR}/estimate_pp_zbh1 -P ${CMAKE_CURRENT_SOURCE_DIR}/estimate_agreement.cmake)
set_tests_properties(e2e_estimate_agrees_pp2_zb-h1_attention_peak.np2 PROPERTIES LABELS e2e TIMEOUT 150
  ENVIRONMENT "${ZS_MPI_ENV}" PROCESSORS 2 PASS_REGULAR_EXPRESSION "estimate agreement ok")
# ... pp 2 x tp 2 with sequence parallelism, bf16, ZeRO 2 (tests/configs/estimate_pp_tp.json): one tp
# rank's slices of each stage, byte for byte.
add_test(NAME e2e_estimate_agrees_pp2_tp2_stage2.np4 COMMAND ${CMAKE_COMMAND} -DTOOL=$<TARGET_FILE:zeroshard>
  -DMPIEXEC=${MPIEXEC_EXECUTABLE} -DCONFIG=${PROJECT_SOURCE_DIR}/tests/configs/estimate_pp_tp.json -DSTAGE=2 -DNP=4
  -DTP=2 -DPP=2 -DWORK=${CMAKE_CURRENT_BINARY_DIR}/estimate_pp -P ${CMAKE_CURRENT_SOURCE_DIR}/estimate_agreement.cmake)
set_tests_properties(e2e_estimate_agrees_pp2_tp2_stage2.np4 PROPERTIES LABELS e2e TIMEOUT 150
  ENVIRONMENT "${ZS_MPI_ENV}" PROCESSORS 4 PASS_REGULAR_EXPRESSION "estimate agreement ok")
# ... and with offload: the summary's nvme_bytes and host_peak_bytes against the estimate's tiers.
foreach(offload cpu nvme)
  foreach(stage 1 2 3)
    foreach(np 1 2)
      set(name e2e_estimate_agrees_stage${stage}_${offload}.np${np})
      add_test(NAME ${name} COMMAND ${CMAKE_COMMAND} -DTOOL=$<TARGET_FILE:zeroshard> -DMPIEXEC=${MPIEXEC_EXECUTABLE}
        -DCONFIG=${est_cfg} -DSTAGE=${stage} -DNP=${np} -DOFFLOAD=${offload} -DWORK=${CMAKE_CURRENT_BINARY_DIR}/estimate
        -P ${CMAKE_CURRENT_SOURCE_DIR}/estimate_agreement.cmake)
      set_tests_properties(${name} PROPERTIES LABELS e2e TIMEOUT 150 ENVIRONMENT "${ZS_MPI_ENV}" PROCESSORS ${np}
        PASS_REGULAR_EXPRESSION "estimate agreement ok")
    endforeach()
  endforeach()
endforeach()
