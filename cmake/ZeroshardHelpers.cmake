# Helpers shared by every module's CMakeLists.txt.

set(ZS_MODULES "" CACHE INTERNAL "zeroshard module targets, in dependency order")

# Note [Precompiled headers]
# On the 2-core machines the first build is most of `make test`'s time, and most of a source's compile
# is its headers: 1.9 of an engine source's 2.3 s of CPU, 1.1-1.4 s of a test's 3-5 s (GoogleTest,
# fmt, spdlog, the standard library). So the libraries' sources reuse one precompiled header of the
# standard and third-party headers (cmake/pch/common.h, built by the donor target zs_pch_lib), and the
# test executables another with GoogleTest added (cmake/pch/test.h, zs_pch_test): one per kind of code,
# since GCC accepts a precompiled header only under the flags it was made with (-fPIC for libraries,
# -fPIE and GTEST_HAS_PTHREAD for tests). A source compiled with flags it refuses the header under (the
# AVX2/AVX-512 kernels, optim's -fno-math-errno) is marked SKIP_PRECOMPILE_HEADERS and parses its
# headers itself, as before.
# The project's own headers stay out, so editing one rebuilds only its includers. ZS_PCH=OFF builds
# without (and ccache needs CCACHE_SLOPPINESS=pch_defines,time_macros to cache sources that use it).
option(ZS_PCH "Precompile the standard and third-party headers (cmake/pch/)" ON)
function(zs_pch_donor name kind header source)
  if(NOT ZS_PCH)
    return()
  endif()
  if(kind STREQUAL "library")
    add_library(${name} STATIC ${source})
  else()
    add_executable(${name} ${source})
  endif()
  target_link_libraries(${name} PRIVATE ${ARGN})
  target_precompile_headers(${name} PRIVATE ${header})
endfunction()
function(zs_reuse_pch target donor)
  if(ZS_PCH AND TARGET ${donor})
    target_precompile_headers(${target} REUSE_FROM ${donor})
    # Every source now includes fmt and spdlog, whose non-inline parts live in their libraries.
    target_link_libraries(${target} PRIVATE fmt::fmt spdlog::spdlog)
  endif()
endfunction()

# zs_add_module(NAME core SOURCES a.cpp ... HEADERS a.h ... DEPS zs_core ... [PUBLIC_LIBS ...] [PRIVATE_LIBS ...])
# Defines target zs_<name> (alias zeroshard::<name>). Headers are included by full path
# ("memory/allocator.h") from the source tree, and installed under include/zeroshard/<name>/ (those
# under detail/ are not installed).
function(zs_add_module)
  cmake_parse_arguments(M "" "NAME" "SOURCES;HEADERS;DEPS;PUBLIC_LIBS;PRIVATE_LIBS" ${ARGN})
  set(target zs_${M_NAME})
  add_library(${target} STATIC ${M_SOURCES})
  add_library(zeroshard::${M_NAME} ALIAS ${target})
  target_include_directories(${target} PUBLIC
    $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}>
    $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}/zeroshard>
    $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
  target_link_libraries(${target} PUBLIC ${M_DEPS} ${M_PUBLIC_LIBS} PRIVATE ${M_PRIVATE_LIBS})
  set_target_properties(${target} PROPERTIES EXPORT_NAME ${M_NAME})
  zs_reuse_pch(${target} zs_pch_lib)  # Note [Precompiled headers]
  install(TARGETS ${target} EXPORT zeroshardTargets ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
  foreach(h ${M_HEADERS})
    # Internals (detail/) are listed for IDEs but not installed: no public header includes them.
    if(h MATCHES "^detail/")
      continue()
    endif()
    get_filename_component(dir ${h} DIRECTORY)
    install(FILES ${h} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/zeroshard/${M_NAME}/${dir})
  endforeach()
  set(ZS_MODULES ${ZS_MODULES} ${target} CACHE INTERNAL "")
endfunction()

# zs_isa_sources(avx512bf16|avx512|avx2 file...): compiles these files for one instruction set. The rest of the
# build stays baseline x86-64, and callers choose a kernel at run time (memory/cpu_features.h).
function(zs_isa_sources isa)
  if(isa STREQUAL "avx512")
    set(flags -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx2 -mfma -mf16c)
  elseif(isa STREQUAL "avx512bf16")
    set(flags -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512bf16 -mavx2 -mfma -mf16c)
  elseif(isa STREQUAL "avx2")
    set(flags -mavx2 -mfma -mf16c)
  else()
    message(FATAL_ERROR "zs_isa_sources: unknown ISA '${isa}' (use avx512bf16, avx512 or avx2)")
  endif()
  # SKIP_PRECOMPILE_HEADERS: GCC refuses a precompiled header made without these -m flags (Note
  # [Precompiled headers]); skipping it spares the warning that says so.
  set_source_files_properties(${ARGN} PROPERTIES COMPILE_OPTIONS "${flags}" SKIP_PRECOMPILE_HEADERS ON)
endfunction()

set(ZS_UNIT_ENV "OPENBLAS_NUM_THREADS=1;OMP_NUM_THREADS=1")
if(ZS_SANITIZE)
  # Full unwinding, so the suppressions (OpenMPI's own start-up leaks) match whole stacks.
  # UBSan is built with -fno-sanitize-recover (CMakeLists.txt), so a report stops the test; halt_on_error
  # says so again for code built without it, and the stack names the caller.
  list(APPEND ZS_UNIT_ENV "ASAN_OPTIONS=fast_unwind_on_malloc=0"
       "LSAN_OPTIONS=suppressions=${PROJECT_SOURCE_DIR}/tests/support/lsan.supp:print_suppressions=0"
       "UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1")
endif()
if(ZS_TSAN)
  list(APPEND ZS_UNIT_ENV "TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:suppressions=${PROJECT_SOURCE_DIR}/tests/support/tsan.supp")
endif()
# odls_base_sigkill_timeout 0: when a rank exits non-zero, mpirun SIGTERMs the others and then sleeps this
# many seconds before its SIGKILL, even when every rank is already gone (OpenMPI 4.1's default 1 s). A third
# of the MPI tests end non-zero on purpose (a bad config, a killed or stalled peer); the sleep doubled their
# time (36 e2e_bad tests: 23.6 s -> 4.4 s at -j2). Nothing a test checks is lost to the early SIGKILL: on an
# agreed error the failing rank prints before it returns (Note [errors across ranks] in
# tools/train_command.cpp) and no rank exits before every rank is in MPI_Finalize, whose fence waits for
# all; a fatal error prints before its MPI_Abort (comm::World::abort).
# pml ob1: the PML every test job chose already (Debian's /etc/openmpi/openmpi-mca-params.conf has
# `pml = ^ucx`, and pml cm finds no MTL here), named so that OpenMPI stops opening cm and its MTLs
# (psm, psm2) in every rank to reject them: 0.2 s of each job's start (mpirun -np 1-4 of an empty
# MPI_Init/MPI_Finalize program: 0.44-0.56 s -> 0.23-0.38 s), over 300 jobs in make test.
set(ZS_MPI_ENV "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1;OMPI_MCA_odls_base_sigkill_timeout=0;OMPI_MCA_pml=ob1;${ZS_UNIT_ENV}")

# zs_add_test(NAME n SOURCES ... LIBS ... [LABELS unit] [TIMEOUT s] [KERNEL_VARIANTS]): one gtest
# executable, one ctest test. KERNEL_VARIANTS, for tests whose numbers depend on the kernels that
# compute them, registers two more runs of the same binary, each pinned to one x86-64 kernel set
# (docs/design.md, "Kernel variants of the numerical tests"):
#   n.avx2    OpenBLAS Haswell kernels, the library's AVX2 path (--isa=avx2): an AVX2-only CPU
#   n.avx512  OpenBLAS SkylakeX kernels, the library's AVX-512 path: an AVX-512 CPU (Intel or Zen 4/5),
#             with the AVX512-BF16 product kernel wherever the CPU has it (ZS_BF16_GEMM=native: the
#             plain run takes it only where it outruns sgemm, nn/detail/gemm.h)
# The plain n runs whatever OpenBLAS and the library pick here. A variant the CPU cannot run exits 77
# and is reported as skipped (tests/support/kernel_test_main.cpp).
# zs_test_targets(LABEL l TARGETS t...): the tests labelled l run these targets, so the umbrella
# target tests_<l> (tests/CMakeLists.txt) builds them; zs_add_test and zs_add_mpi_test call it themselves.
# A sanitizer build (.ci/run) builds tests_asan or tests_threads, not everything.
function(zs_test_targets)
  cmake_parse_arguments(L "" "LABEL" "TARGETS" ${ARGN})
  set_property(GLOBAL APPEND PROPERTY ZS_TEST_TARGETS_${L_LABEL} ${L_TARGETS})
endfunction()

# Note [Test optimisation level]
# The release preset builds the libraries at -O3 and the test executables' own code at -O1
# (zs_test_optimize): gtest's macros make test sources slow to compile and fast to run, and the
# numbers a test checks are computed by the libraries it links, at -O3. On a 2-core machine the test
# objects were 270 of the build's 508 CPU-seconds; -O1 compiles them ~38% faster (config_test.cpp 7.4 ->
# 4.5 s). The test precompiled header is built at the same level (its users must match it).
function(zs_test_optimize target)
  target_compile_options(${target} PRIVATE $<$<CONFIG:Release>:-O1>)
endfunction()

function(zs_add_test)
  cmake_parse_arguments(T "KERNEL_VARIANTS" "NAME;TIMEOUT" "SOURCES;LIBS;LABELS" ${ARGN})
  add_executable(${T_NAME} ${T_SOURCES})
  zs_test_optimize(${T_NAME})  # Note [Test optimisation level]
  zs_reuse_pch(${T_NAME} zs_pch_test)  # Note [Precompiled headers]
  if(T_KERNEL_VARIANTS)
    target_link_libraries(${T_NAME} PRIVATE ${T_LIBS} GTest::gtest zs_test_kernel_main)
  else()
    target_link_libraries(${T_NAME} PRIVATE ${T_LIBS} GTest::gtest GTest::gtest_main)
  endif()
  if(NOT T_LABELS)
    set(T_LABELS unit)
  endif()
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 120)
  endif()
  if(ZS_SANITIZE)
    # ASan+UBSan runs 2-4x slower: memory_allocator_test and comm_collectives_test.np2 ran past their
    # release limits of 120 s on a loaded 2-core machine.
    math(EXPR T_TIMEOUT "${T_TIMEOUT} * 3")
  endif()
  foreach(label ${T_LABELS})
    zs_test_targets(LABEL ${label} TARGETS ${T_NAME})
  endforeach()
  add_test(NAME ${T_NAME} COMMAND ${T_NAME})
  set_tests_properties(${T_NAME} PROPERTIES LABELS "${T_LABELS}" TIMEOUT ${T_TIMEOUT}
    ENVIRONMENT "${ZS_UNIT_ENV}")
  if(T_KERNEL_VARIANTS)
    foreach(variant "avx2;Haswell" "avx512;SkylakeX")
      list(GET variant 0 isa)
      list(GET variant 1 core)
      add_test(NAME ${T_NAME}.${isa} COMMAND ${T_NAME} --isa=${isa} --blas-core=${core})
      set_tests_properties(${T_NAME}.${isa} PROPERTIES LABELS "${T_LABELS};kernels" TIMEOUT ${T_TIMEOUT}
        ENVIRONMENT "${ZS_UNIT_ENV};OPENBLAS_CORETYPE=${core};ZS_BF16_GEMM=native" SKIP_RETURN_CODE 77)
    endforeach()
  endif()
endfunction()

# OpenMPI forced onto TCP (the tcp-labelled MPI tests; docs/reliability.md).
set(ZS_MPI_TCP_ENV "OMPI_MCA_pml=ob1;OMPI_MCA_btl=tcp,self;OMPI_MCA_btl_tcp_if_include=lo")

# zs_add_mpi_test(NAME n SOURCES ... LIBS ... NP 1 2 3 4 [TIMEOUT s] [KERNEL_VARIANTS np [args...]]):
# one gtest executable run under mpirun once per world size, as tests n.np1, n.np2, ... labelled mpi,
# and the largest once more over TCP as n.tcp.npN, labelled tcp. KERNEL_VARIANTS registers
# n.avx2.np<np> and n.avx512.np<np> (as zs_add_test's; label kernels), at one world size and with the
# test's extra arguments (a --gtest_filter to the numerically sensitive part, to keep make test short).
# The run-as-root and oversubscribe settings live here, not with the person running the tests.
function(zs_add_mpi_test)
  cmake_parse_arguments(T "" "NAME;TIMEOUT" "SOURCES;LIBS;NP;LABELS;KERNEL_VARIANTS" ${ARGN})
  add_executable(${T_NAME} ${T_SOURCES})
  zs_test_optimize(${T_NAME})  # Note [Test optimisation level]
  zs_reuse_pch(${T_NAME} zs_pch_test)  # Note [Precompiled headers]
  target_link_libraries(${T_NAME} PRIVATE ${T_LIBS} GTest::gtest zs_test_mpi_main)
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 180)
  endif()
  if(ZS_SANITIZE)
    # As in zs_add_test: ASan+UBSan is slower.
    math(EXPR T_TIMEOUT "${T_TIMEOUT} * 3")
  endif()
  if(NOT T_LABELS)
    set(T_LABELS mpi)
  endif()
  foreach(label ${T_LABELS})
    zs_test_targets(LABEL ${label} TARGETS ${T_NAME})
  endforeach()
  foreach(np ${T_NP})
    add_test(NAME ${T_NAME}.np${np}
      COMMAND ${MPIEXEC_EXECUTABLE} --oversubscribe -np ${np} $<TARGET_FILE:${T_NAME}>)
    set_tests_properties(${T_NAME}.np${np} PROPERTIES LABELS "${T_LABELS}" TIMEOUT ${T_TIMEOUT}
      ENVIRONMENT "${ZS_MPI_ENV}" PROCESSORS ${np})
  endforeach()
  if(T_KERNEL_VARIANTS)
    list(POP_FRONT T_KERNEL_VARIANTS np)
    foreach(variant "avx2;Haswell" "avx512;SkylakeX")
      list(GET variant 0 isa)
      list(GET variant 1 core)
      add_test(NAME ${T_NAME}.${isa}.np${np}
        COMMAND ${MPIEXEC_EXECUTABLE} --oversubscribe -np ${np} $<TARGET_FILE:${T_NAME}> --isa=${isa}
                --blas-core=${core} ${T_KERNEL_VARIANTS})
      set_tests_properties(${T_NAME}.${isa}.np${np} PROPERTIES LABELS "${T_LABELS};kernels" TIMEOUT ${T_TIMEOUT}
        ENVIRONMENT "${ZS_MPI_ENV};OPENBLAS_CORETYPE=${core};ZS_BF16_GEMM=native" PROCESSORS ${np} SKIP_RETURN_CODE 77)
    endforeach()
  endif()
  # Any transport: the largest world size once more with OpenMPI on TCP (ob1 over the tcp BTL on the
  # loopback interface, no shared-memory BTL), the transport of a multi-node run. Label tcp.
  list(GET T_NP -1 np)
  add_test(NAME ${T_NAME}.tcp.np${np}
    COMMAND ${MPIEXEC_EXECUTABLE} --oversubscribe -np ${np} $<TARGET_FILE:${T_NAME}>)
  set_tests_properties(${T_NAME}.tcp.np${np} PROPERTIES LABELS "tcp" TIMEOUT ${T_TIMEOUT}
    ENVIRONMENT "${ZS_MPI_ENV};${ZS_MPI_TCP_ENV}" PROCESSORS ${np})
endfunction()

# zs_add_expect_failure(NAME test NP np EXE target MODE mode REGEX regex [ANY_EXIT] [MPIEXEC_ARGS args...])
# A deliberately broken MPI job (a stalled or killed rank, mismatched collectives) that must exit
# non-zero within 30 s with output matching REGEX (tests/comm/expect_failure.cmake; ANY_EXIT: exit 0
# passes too, for mpirun --enable-recovery). Label mpi.
# Note [waiting tests take one slot]: such a job spends its seconds waiting for comm.timeout_s, not
# computing (measured with /usr/bin/time around each rank: comm_stall_timeout.np2, under 0.1 CPU-s a
# rank in 2.4 s; comm_timeout_test.np2, 0.2 CPU-s a rank in 5.9 s), so ctest gives it one slot of -j,
# not one per rank: two of them, or one beside a single-process test, run at once. Given np slots, as other MPI
# tests are, the ~20 of them ran one after another, about 50 s of make test's wall time.
function(zs_add_expect_failure)
  cmake_parse_arguments(F "ANY_EXIT" "NAME;NP;EXE;MODE;REGEX" "MPIEXEC_ARGS" ${ARGN})
  set(any_exit 0)
  if(F_ANY_EXIT)
    set(any_exit 1)
  endif()
  add_test(NAME ${F_NAME}
    COMMAND ${CMAKE_COMMAND} -DMPIEXEC=${MPIEXEC_EXECUTABLE} "-DMPIEXEC_ARGS=${F_MPIEXEC_ARGS}" -DANY_EXIT=${any_exit}
            -DNP=${F_NP} -DEXE=$<TARGET_FILE:${F_EXE}> -DMODE=${F_MODE} -DREGEX=${F_REGEX} -DMAX_SECONDS=30
            -P ${PROJECT_SOURCE_DIR}/tests/comm/expect_failure.cmake)
  set_tests_properties(${F_NAME} PROPERTIES LABELS mpi TIMEOUT 60 ENVIRONMENT "${ZS_MPI_ENV}" PROCESSORS 1)
endfunction()

function(zs_install_package)
  include(CMakePackageConfigHelpers)
  install(EXPORT zeroshardTargets NAMESPACE zeroshard:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/zeroshard)
  configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/zeroshardConfig.cmake.in
    ${PROJECT_BINARY_DIR}/zeroshardConfig.cmake INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/zeroshard)
  write_basic_package_version_file(${PROJECT_BINARY_DIR}/zeroshardConfigVersion.cmake
    VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
  install(FILES ${PROJECT_BINARY_DIR}/zeroshardConfig.cmake ${PROJECT_BINARY_DIR}/zeroshardConfigVersion.cmake
    DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/zeroshard)
endfunction()
