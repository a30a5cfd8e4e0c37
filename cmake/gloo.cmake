# Which Gloo ddp runs on. Defines the INTERFACE target `ddp_gloo` that the
# library's parts link, and DDP_GLOO_KIND (SYSTEM or PRIVATE).
#
# A process must not hold two Gloos that export the same C++ symbols: the
# dynamic linker binds every call to whichever copy was loaded first, and two
# Gloo versions then run on each other's class layouts (the Store vtable
# alone differs between 2022's Gloo and the one inside PyTorch 2.x). So:
#
# - SYSTEM: link the Gloo that find_package(Gloo) finds (Debian's
#   libgloo.so). Right when LibTorch itself links that same shared libgloo
#   (Debian's LibTorch does), or carries no Gloo: the process has one Gloo.
# - PRIVATE: compile Gloo from DDP_GLOO_SOURCE_DIR into libddp.so with hidden
#   visibility, so that none of its symbols is exported and ddp's calls bind
#   to it at link time. Needed when LibTorch carries its own Gloo and exports
#   it (PyPI's torch wheels: libtorch_cpu.so defines gloo::* and ships no
#   Gloo headers to build against it). Every ddp source reaches Gloo through
#   src/comm/gloo_api.h, which makes Gloo's declarations hidden in this mode.
# - AUTO (the default): PRIVATE when LibTorch's libtorch_cpu exports Gloo
#   functions, otherwise SYSTEM.
#
# docs/design.md ("Two Gloos in one process") has the reasoning, and the test
# gloo_origin_test shows which copy a running program uses.
set(DDP_GLOO "AUTO" CACHE STRING
    "Gloo to build on: AUTO, SYSTEM (find_package(Gloo)) or PRIVATE (compiled from DDP_GLOO_SOURCE_DIR, hidden)")
set_property(CACHE DDP_GLOO PROPERTY STRINGS AUTO SYSTEM PRIVATE)
set(DDP_GLOO_SOURCE_DIR "" CACHE PATH
    "A Gloo source tree (holding gloo/allreduce.cc) for DDP_GLOO=PRIVATE")

# Counts the Gloo functions that LibTorch's libtorch_cpu defines and exports.
find_library(DDP_TORCH_CPU_LIBRARY torch_cpu PATHS "${TORCH_INSTALL_PREFIX}/lib" NO_DEFAULT_PATH)
if(NOT DDP_TORCH_CPU_LIBRARY)
  find_library(DDP_TORCH_CPU_LIBRARY torch_cpu)
endif()
set(DDP_TORCH_GLOO_EXPORTS 0)
if(DDP_TORCH_CPU_LIBRARY AND CMAKE_NM)
  execute_process(COMMAND ${CMAKE_NM} -D --defined-only ${DDP_TORCH_CPU_LIBRARY}
    OUTPUT_VARIABLE _ddp_torch_symbols ERROR_QUIET RESULT_VARIABLE _ddp_nm_rc)
  if(_ddp_nm_rc EQUAL 0)
    string(REGEX MATCHALL " T _ZN4gloo" _ddp_gloo_functions "${_ddp_torch_symbols}")
    list(LENGTH _ddp_gloo_functions DDP_TORCH_GLOO_EXPORTS)
  endif()
  unset(_ddp_torch_symbols)
endif()

set(DDP_GLOO_KIND ${DDP_GLOO})
if(DDP_GLOO STREQUAL "AUTO")
  if(DDP_TORCH_GLOO_EXPORTS GREATER 0)
    set(DDP_GLOO_KIND PRIVATE)
  else()
    set(DDP_GLOO_KIND SYSTEM)
  endif()
elseif(NOT DDP_GLOO MATCHES "^(SYSTEM|PRIVATE)$")
  message(FATAL_ERROR "DDP_GLOO must be AUTO, SYSTEM or PRIVATE (got '${DDP_GLOO}')")
endif()
if(DDP_GLOO_KIND STREQUAL "SYSTEM" AND DDP_TORCH_GLOO_EXPORTS GREATER 0)
  message(FATAL_ERROR "DDP_GLOO=SYSTEM, but ${DDP_TORCH_CPU_LIBRARY} carries its own Gloo and "
    "exports ${DDP_TORCH_GLOO_EXPORTS} of its functions: a second, shared Gloo in the same process "
    "would be mixed with it. Use DDP_GLOO=PRIVATE (or AUTO) with DDP_GLOO_SOURCE_DIR.")
endif()

add_library(ddp_gloo INTERFACE)
if(DDP_GLOO_KIND STREQUAL "SYSTEM")
  find_package(Gloo CONFIG REQUIRED)
  target_link_libraries(ddp_gloo INTERFACE gloo)
  message(STATUS "ddp: Gloo SYSTEM (${Gloo_DIR}); LibTorch exports no Gloo of its own")
  return()
endif()

# ---- PRIVATE: Gloo's core and TCP transport, compiled hidden ------------------
if(NOT EXISTS "${DDP_GLOO_SOURCE_DIR}/gloo/allreduce.cc")
  message(FATAL_ERROR "ddp needs a private Gloo: ${DDP_TORCH_CPU_LIBRARY} exports "
    "${DDP_TORCH_GLOO_EXPORTS} Gloo functions of its own (a PyPI torch wheel), so Debian's shared "
    "libgloo must not be loaded beside it. Set DDP_GLOO_SOURCE_DIR to a Gloo source tree "
    "(got '${DDP_GLOO_SOURCE_DIR}'); scripts/compat.sh fetches one from PyPI. "
    "See docs/design.md, \"Two Gloos in one process\".")
endif()
set(_ddp_gloo_src ${DDP_GLOO_SOURCE_DIR}/gloo)
file(GLOB _ddp_gloo_sources
  ${_ddp_gloo_src}/*.cc
  ${_ddp_gloo_src}/common/*.cc
  ${_ddp_gloo_src}/rendezvous/*.cc
  ${_ddp_gloo_src}/transport/*.cc
  ${_ddp_gloo_src}/transport/tcp/*.cc)
# CUDA, MPI, Redis, libuv and Windows parts are not built.
list(FILTER _ddp_gloo_sources EXCLUDE REGEX "/(cuda[^/]*|win|redis_store|nccl[^/]*)\\.cc$")

set(_ddp_gloo_config ${PROJECT_BINARY_DIR}/private_gloo/include/gloo/config.h)
file(WRITE ${_ddp_gloo_config}.in
  "#pragma once\n// Written by cmake/gloo.cmake for ddp's private Gloo.\n"
  "#define GLOO_VERSION_MAJOR 0\n#define GLOO_VERSION_MINOR 5\n#define GLOO_VERSION_PATCH 0\n"
  "#define GLOO_VERSION (GLOO_VERSION_MAJOR * 10000 + GLOO_VERSION_MINOR * 100 + GLOO_VERSION_PATCH)\n"
  "#define GLOO_USE_CUDA 0\n#define GLOO_USE_NCCL 0\n#define GLOO_USE_ROCM 0\n#define GLOO_USE_RCCL 0\n"
  "#define GLOO_USE_REDIS 0\n#define GLOO_USE_IBVERBS 0\n#define GLOO_USE_MPI 0\n#define GLOO_USE_AVX 0\n"
  "#define GLOO_USE_LIBUV 0\n#define GLOO_HAVE_TRANSPORT_TCP 1\n#define GLOO_HAVE_TRANSPORT_TCP_TLS 0\n"
  "#define GLOO_HAVE_TRANSPORT_IBVERBS 0\n#define GLOO_HAVE_TRANSPORT_UV 0\n")
configure_file(${_ddp_gloo_config}.in ${_ddp_gloo_config} COPYONLY)

add_library(ddp_private_gloo STATIC ${_ddp_gloo_sources})
target_include_directories(ddp_private_gloo SYSTEM PUBLIC
  ${PROJECT_BINARY_DIR}/private_gloo/include ${DDP_GLOO_SOURCE_DIR})
target_link_libraries(ddp_private_gloo PUBLIC Threads::Threads)
set_target_properties(ddp_private_gloo PROPERTIES
  POSITION_INDEPENDENT_CODE ON
  CXX_VISIBILITY_PRESET hidden
  VISIBILITY_INLINES_HIDDEN ON)
# Third-party code: its warnings are not ours to fix.
target_compile_options(ddp_private_gloo PRIVATE -w)
# Whole archive: a member that no ddp object names directly (the TCP event
# loop, say) would otherwise be left out whenever LibTorch, earlier on the
# link line, already defines its symbols, and the call would bind to
# LibTorch's Gloo. tests/comm/gloo_origin_test checks that none does.
target_link_libraries(ddp_gloo INTERFACE
  "-Wl,--whole-archive" ddp_private_gloo "-Wl,--no-whole-archive")
target_compile_definitions(ddp_gloo INTERFACE DDP_PRIVATE_GLOO=1)
list(LENGTH _ddp_gloo_sources _ddp_gloo_count)
message(STATUS "ddp: Gloo PRIVATE, ${_ddp_gloo_count} files from ${DDP_GLOO_SOURCE_DIR}, hidden in libddp "
  "(LibTorch exports ${DDP_TORCH_GLOO_EXPORTS} Gloo functions of its own)")
