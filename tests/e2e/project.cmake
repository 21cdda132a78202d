# `zeroshard project` end to end (included by tests/e2e/CMakeLists.txt, which defines zs_e2e, tool,
# ZS_BAD and one_error): the table, every bad flag with its named error, and the projection's bytes
# against a real run's counters for each kind of layout (tests/e2e/project_agreement.cmake).
set(proj_cfg ${PROJECT_SOURCE_DIR}/tests/configs/project_tiny.json)

zs_e2e(NAME project_table EXPECT pass
  REGEX "GPT n_layer 2 d_model 32 n_head 4 seq_len 16 on 2 ranks, 1 per host \\(2 host\\(s\\)\\); network 1gbit,20us.*dp +tp +pp +ZeRO +step.*\n +2 +1 +1 +1 "
  COMMAND ${tool} project --config ${proj_cfg} --ranks 2 --ranks-per-host 1 --network 1gbit,20us --tp 1 --pp 1)
zs_e2e(NAME project_bad_ranks_per_host EXPECT fail ONCE "${one_error}"
  REGEX "--ranks-per-host: 3 does not divide --ranks 4; give a divisor of 4"
  COMMAND ${tool} project --config ${proj_cfg} --ranks 4 --ranks-per-host 3 --network 1gbit,20us)
zs_e2e(NAME project_bad_layout EXPECT fail ONCE "${one_error}"
  REGEX "--tp 3 x --pp 1 does not divide --ranks 4; give degrees whose product divides 4"
  COMMAND ${tool} project --config ${proj_cfg} --ranks 4 --tp 3)
zs_e2e(NAME project_bad_network_unit EXPECT fail ONCE "${one_error}"
  REGEX "--network: bandwidth '10gbits' is not a number with a unit; give BANDWIDTH,LATENCY such as 10gbit,20us"
  COMMAND ${tool} project --config ${proj_cfg} --ranks 2 --ranks-per-host 1 --network 10gbits,20us)
zs_e2e(NAME project_bad_network_latency EXPECT fail ONCE "${one_error}"
  REGEX "--network: latency '20' is not a number with a unit"
  COMMAND ${tool} project --config ${proj_cfg} --ranks 2 --ranks-per-host 1 --network 10gbit,20)
zs_e2e(NAME project_bad_network_comma EXPECT fail ONCE "${one_error}"
  REGEX "--network: '10gbit' has no comma"
  COMMAND ${tool} project --config ${proj_cfg} --ranks 2 --ranks-per-host 1 --network 10gbit)
zs_e2e(NAME project_needs_network EXPECT fail ONCE "${one_error}"
  REGEX "--network: 4 ranks on hosts of 2 need the link between hosts; give --network BANDWIDTH,LATENCY"
  COMMAND ${tool} project --config ${proj_cfg} --ranks 4 --ranks-per-host 2)
zs_e2e(NAME project_bad_link_costs EXPECT fail ONCE "${one_error}"
  REGEX "--link-costs: '[^']*project_tiny.json': ranks is missing or not a number; give the JSON of benchmarks/step_comm_probe"
  COMMAND ${tool} project --config ${proj_cfg} --ranks 2 --ranks-per-host 1 --network 1gbit,20us --link-costs ${proj_cfg})
zs_e2e(NAME project_no_model EXPECT fail ONCE "${one_error}"
  REGEX "model: the config has no model section"
  COMMAND ${tool} project --config ${ZS_BAD}/estimate_no_model.json --ranks 2)

# Bytes per rank and step, projection = run, for every kind of layout: dp 2 at ZeRO stages 0-3, tp 2,
# pp 2, ep 2 (an MoE model) on one host, and dp 2 and ep 2 on two real hosts of one rank, ZeRO++ on two
# hosts of 2 (bytes across hosts; label multihost, as
# tests/multihost: network namespaces, root), those projected with the in-step costs step_comm_probe
# measures on the same hosts (--link-costs: the bytes stay the run's). dp 2 at stage 3 is in make test; the others are slow.
# The probe is a benchmark, built with the tests where benchmarks are configured (not in the sanitizer
# presets, ZS_BUILD_BENCHMARKS OFF): without it the two-host cases check the bytes alone.
set(probe_arg "")
if(ZS_BUILD_BENCHMARKS)
  set(probe_arg -DPROBE=$<TARGET_FILE:step_comm_probe>)
endif()
# Extra arguments after the labels: -D definitions for project_agreement.cmake (NP, EP, ZEROPP).
function(zs_project_agreement name stage tp pp rph labels)
  set(np 2)
  set(defs)
  foreach(d ${ARGN})
    if(d MATCHES "^-DNP=([0-9]+)$")
      set(np ${CMAKE_MATCH_1})
    else()
      list(APPEND defs ${d})
    endif()
  endforeach()
  add_test(NAME e2e_project_agrees_${name}.np${np} COMMAND ${CMAKE_COMMAND} -DTOOL=${tool} -DMPIEXEC=${MPIEXEC_EXECUTABLE}
    -DCONFIG=${proj_cfg} -DSTAGE=${stage} -DNP=${np} -DTP=${tp} -DPP=${pp} -DRPH=${rph} -DWORK=${out}/project_agreement
    -DHOSTS_SH=${PROJECT_SOURCE_DIR}/tests/multihost/hosts.sh ${probe_arg} ${defs}
    -P ${CMAKE_CURRENT_SOURCE_DIR}/project_agreement.cmake)
  set_tests_properties(e2e_project_agrees_${name}.np${np} PROPERTIES LABELS "${labels}" TIMEOUT 200
    ENVIRONMENT "${ZS_MPI_ENV}" PROCESSORS 2 PASS_REGULAR_EXPRESSION "projection agreement ok|agreement skipped")
endfunction()
zs_project_agreement(dp2_stage3 3 1 1 2 "e2e")
zs_project_agreement(dp2_stage0 0 1 1 2 "e2e;slow")
zs_project_agreement(dp2_stage1 1 1 1 2 "e2e;slow")
zs_project_agreement(dp2_stage2 2 1 1 2 "e2e;slow")
zs_project_agreement(tp2 1 2 1 2 "e2e;slow")
zs_project_agreement(pp2 1 1 2 2 "e2e;slow")
# An MoE model at ep 2 (its all-to-alls on the "ep" group, its experts' ZeRO on "edp"), one host and two;
# ZeRO++ (hpZ, qwZ, qgZ) on two hosts of 2.
zs_project_agreement(moe_ep2 1 1 1 2 "e2e" -DEP=2)
zs_project_agreement(moe_ep2_stage3_hosts1 3 1 1 1 "multihost" -DEP=2)
zs_project_agreement(zeropp_hosts2 3 1 1 2 "multihost" -DNP=4 -DZEROPP=1)
zs_project_agreement(dp2_stage3_hosts1 3 1 1 1 "multihost")
zs_project_agreement(dp2_stage1_hosts1 1 1 1 1 "multihost")
