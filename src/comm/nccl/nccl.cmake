# The NCCL backend: ProcessGroupNCCL, its engine and support code.
#
# 1. The part `ddp_nccl`, built only when cmake/nccl.cmake found a LibTorch
#    with CUDA and an NCCL library (DDP_HAVE_NCCL).
# 2. When the backend is not built but the headers can be found,
#    `ddp_nccl_syntax_check`: the same
#    sources (and init.cpp's NCCL branch) compiled with -fsyntax-only against
#    the CUDA runtime, NCCL and c10/cuda headers, with DDP_WITH_NCCL=1. It
#    needs no CUDA library and no GPU, so that a CPU-only machine still
#    type-checks the backend (tests/gpu/gpu.cmake runs it as the test
#    `nccl_backend_compiles`). It is not part of `all`.
set(DDP_NCCL_SOURCES
  src/comm/nccl/nccl_support.cpp
  src/comm/nccl/nccl_engine.cpp
  src/comm/nccl/nccl_work.cpp
  src/comm/nccl/nccl_watchdog.cpp
  src/comm/nccl/process_group_nccl.cpp)

if(DDP_HAVE_NCCL)
  # What the NCCL sources need from CUDA beyond nccl.h: the runtime
  # (cudaEvent*, cudaMemcpyAsync) and c10_cuda (streams, the caching
  # allocator). They go on ddp_nccl_deps, which `ddp` links, because the
  # library is assembled from the parts' objects and does not see the parts'
  # own link dependencies.
  if(TORCH_CUDA_LIBRARIES)
    target_link_libraries(ddp_nccl_deps INTERFACE ${TORCH_CUDA_LIBRARIES})
  endif()
  if(TARGET torch::cudart)
    target_link_libraries(ddp_nccl_deps INTERFACE torch::cudart)
  else()
    find_package(CUDAToolkit REQUIRED)
    target_link_libraries(ddp_nccl_deps INTERFACE CUDA::cudart)
  endif()

  ddp_add_part(ddp_nccl ${DDP_NCCL_SOURCES})
  # Compiled file by file: its files include CUDA's and NCCL's headers, and
  # the CPU-only machines that build it cannot run what they compile.
  set_target_properties(ddp_nccl PROPERTIES UNITY_BUILD OFF)
  target_link_libraries(ddp_nccl PUBLIC ddp_nccl_deps)
  target_compile_definitions(ddp_nccl PRIVATE DDP_WITH_NCCL=1)
  # init.cpp creates a ProcessGroupNCCL for Backend::kNccl and kAuto. On that
  # file alone, so that ddp_comm's precompiled header, which the backends'
  # parts reuse, is built without it (as DDP_WITH_MPI in mpi.cmake).
  set_property(SOURCE ${PROJECT_SOURCE_DIR}/src/comm/init.cpp APPEND PROPERTY
    COMPILE_DEFINITIONS DDP_WITH_NCCL=1)
endif()

# ---- The syntax check --------------------------------------------------------------
find_path(DDP_CHECK_NCCL_INCLUDE_DIR nccl.h
  HINTS ${NCCL_INCLUDE_DIR} $ENV{NCCL_ROOT} $ENV{NCCL_HOME} ${NCCL_ROOT} /usr/local/cuda
  PATH_SUFFIXES include
  DOC "nccl.h for ddp_nccl_syntax_check")
find_path(DDP_CHECK_CUDA_INCLUDE_DIR cuda_runtime.h
  HINTS $ENV{CUDA_HOME} $ENV{CUDA_PATH} ${CUDAToolkit_ROOT} /usr/local/cuda
  PATH_SUFFIXES include
  DOC "cuda_runtime.h for ddp_nccl_syntax_check")
find_path(DDP_CHECK_C10_CUDA_INCLUDE_DIR c10/cuda/CUDAStream.h
  HINTS ${TORCH_INCLUDE_DIRS}
  DOC "c10/cuda headers (LibTorch) for ddp_nccl_syntax_check")

set(DDP_NCCL_SYNTAX_CHECK_SKIP_REASON "")
if(NOT DDP_CHECK_NCCL_INCLUDE_DIR)
  string(APPEND DDP_NCCL_SYNTAX_CHECK_SKIP_REASON "nccl.h not found (set NCCL_ROOT); ")
endif()
if(NOT DDP_CHECK_CUDA_INCLUDE_DIR)
  string(APPEND DDP_NCCL_SYNTAX_CHECK_SKIP_REASON "cuda_runtime.h not found (set CUDA_HOME); ")
endif()
if(NOT DDP_CHECK_C10_CUDA_INCLUDE_DIR)
  string(APPEND DDP_NCCL_SYNTAX_CHECK_SKIP_REASON "c10/cuda headers of LibTorch not found; ")
endif()

if(DDP_HAVE_NCCL)
  # The backend is compiled and linked for real: nothing left to type-check.
  message(STATUS "ddp: no NCCL syntax check: the NCCL backend is built")
elseif(DDP_NCCL_SYNTAX_CHECK_SKIP_REASON STREQUAL "")
  # Include directories of every syntax check (tests/gpu/gpu.cmake reuses it).
  set(DDP_NCCL_CHECK_INCLUDE_DIRS ${DDP_CHECK_NCCL_INCLUDE_DIR} ${DDP_CHECK_CUDA_INCLUDE_DIR})
  # A CPU-only LibTorch (Debian's) ships the c10/cuda headers but not the one
  # its build generates, c10/cuda/impl/cuda_cmake_macros.h. Its whole content
  # is the define below (the value a shared-library LibTorch build writes), so
  # we write it for the check only; nothing is compiled for real with it.
  if(NOT EXISTS "${DDP_CHECK_C10_CUDA_INCLUDE_DIR}/c10/cuda/impl/cuda_cmake_macros.h")
    set(_ddp_shim "${PROJECT_BINARY_DIR}/nccl_syntax_check_include")
    file(WRITE "${_ddp_shim}/c10/cuda/impl/cuda_cmake_macros.h"
      "#pragma once\n// Written by src/comm/nccl/nccl.cmake for ddp_nccl_syntax_check only.\n"
      "#define C10_CUDA_BUILD_SHARED_LIBS\n")
    list(APPEND DDP_NCCL_CHECK_INCLUDE_DIRS ${_ddp_shim})
  endif()

  # The compiles produce no object file, so they run every time the target
  # is built; `ddp_nccl_syntax_check` is their umbrella (the GPU tests'
  # sources are compiled by the CUDA configuration only: tests/gpu/gpu.cmake).
  add_library(ddp_nccl_syntax_check_sources OBJECT EXCLUDE_FROM_ALL
    ${DDP_NCCL_SOURCES} src/comm/init.cpp)
  target_include_directories(ddp_nccl_syntax_check_sources PRIVATE
    ${PROJECT_SOURCE_DIR}/include ${PROJECT_SOURCE_DIR}/src ${DDP_NCCL_CHECK_INCLUDE_DIRS})
  target_link_libraries(ddp_nccl_syntax_check_sources PRIVATE torch ddp_gloo Threads::Threads)
  target_compile_definitions(ddp_nccl_syntax_check_sources PRIVATE DDP_WITH_NCCL=1)
  target_compile_options(ddp_nccl_syntax_check_sources PRIVATE
    -fsyntax-only -Wall -Wextra -Wno-unused-parameter)
  add_custom_target(ddp_nccl_syntax_check)
  add_dependencies(ddp_nccl_syntax_check ddp_nccl_syntax_check_sources)
  message(STATUS "ddp: ddp_nccl_syntax_check checks the NCCL backend against "
    "${DDP_CHECK_NCCL_INCLUDE_DIR}/nccl.h and ${DDP_CHECK_C10_CUDA_INCLUDE_DIR}/c10/cuda")
else()
  message(STATUS "ddp: no NCCL syntax check: ${DDP_NCCL_SYNTAX_CHECK_SKIP_REASON}")
endif()
