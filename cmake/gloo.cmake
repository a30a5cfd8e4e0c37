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
# - PRIVATE: compile Gloo from source (DDP_GLOO_SOURCE_DIR, or a pinned commit
#   fetched at configure time, below) into libddp.so with hidden visibility,
#   so that none of its symbols is exported and ddp's calls bind to it at
#   link time. Needed when LibTorch carries its own Gloo and exports it
#   (PyPI's torch wheels: libtorch_cpu.so defines gloo::* and ships no Gloo
#   headers to build against it). Every ddp source reaches Gloo through
#   src/comm/gloo/gloo_api.h, which makes Gloo's declarations hidden in this
#   mode.
# - AUTO (the default): PRIVATE when LibTorch's libtorch_cpu exports Gloo
#   functions, otherwise SYSTEM.
#
# docs/design.md ("Two Gloos in one process") has the reasoning, and the test
# gloo_origin_test shows which copy a running program uses.
set(DDP_GLOO "AUTO" CACHE STRING
    "Gloo to build on: AUTO, SYSTEM (find_package(Gloo)) or PRIVATE (compiled from source, hidden)")
set_property(CACHE DDP_GLOO PROPERTY STRINGS AUTO SYSTEM PRIVATE)
set(DDP_GLOO_SOURCE_DIR "" CACHE PATH
    "A Gloo source tree (holding gloo/allreduce.cc) for DDP_GLOO=PRIVATE; empty: fetch the pinned commit")

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
    "would be mixed with it. Use DDP_GLOO=PRIVATE (or AUTO).")
endif()

add_library(ddp_gloo INTERFACE)
if(DDP_GLOO_KIND STREQUAL "SYSTEM")
  find_package(Gloo CONFIG REQUIRED)
  target_link_libraries(ddp_gloo INTERFACE gloo)
  message(STATUS "ddp: Gloo SYSTEM (${Gloo_DIR}); LibTorch exports no Gloo of its own")
  return()
endif()

# ---- PRIVATE: where the Gloo source comes from -------------------------------
# DDP_GLOO_SOURCE_DIR first, as CI and scripts/compat.sh pass it; otherwise
# FetchContent, whose standard FETCHCONTENT_SOURCE_DIR_GLOO also names a local
# tree; otherwise the pinned commit from GitHub.
#
# The pin is the Gloo commit that horovod 0.28.1 vendors as third_party/gloo
# (`git ls-tree v0.28.1 third_party/gloo` in horovod), the tree that CI takes
# from that source package on PyPI. A git commit id names its content, so a
# fetch gives that code or fails: every file of the package's copy is
# byte-identical to the commit's, which has 11 files more (Gloo's CI
# configuration, tools/, LICENSE files) and nothing that ddp compiles.
set(_ddp_gloo_git_repository https://github.com/facebookincubator/gloo.git)
set(_ddp_gloo_git_commit d96897b339a07087f588223ca216e75f64e3ca58)
set(_ddp_gloo_sdist horovod==0.28.1)
set(_ddp_gloo_sdist_sha256 92a43f5a94c43907a56805bad15f19700c62ffc83b7ca483f9e104e229f67ef0)

# Stops the configure step when no Gloo source can be had, saying why and
# listing every way that needs no GitHub.
function(ddp_gloo_source_unavailable)
  string(CONCAT what_failed ${ARGN})
  string(REPLACE "==" "-" _archive "${_ddp_gloo_sdist}")
  message(FATAL_ERROR "ddp needs a private Gloo: ${DDP_TORCH_CPU_LIBRARY} exports "
    "${DDP_TORCH_GLOO_EXPORTS} Gloo functions of its own (a PyPI torch wheel or pytorch.org's "
    "LibTorch), so a system libgloo must not be loaded beside it (docs/design.md, \"Two Gloos in one "
    "process\"). With no Gloo source given, ddp fetches Gloo commit ${_ddp_gloo_git_commit} from "
    "${_ddp_gloo_git_repository}, but ${what_failed}\n"
    "Any of these works without GitHub; add its -D option to the same cmake command:\n"
    " (a) a Gloo source tree you have (the folder that holds gloo/allreduce.cc):\n"
    "       -DDDP_GLOO_SOURCE_DIR=/path/to/gloo\n"
    " (b) the same through FetchContent's standard override:\n"
    "       -DFETCHCONTENT_SOURCE_DIR_GLOO=/path/to/gloo\n"
    " (c) the Gloo that CI builds, from ${_ddp_gloo_sdist}'s source package on PyPI,\n"
    "     where pip can reach PyPI (or run this elsewhere and copy the folder):\n"
    "       pip download --no-deps --no-binary :all: ${_ddp_gloo_sdist} -d $HOME/gloo-sdist\n"
    "       echo \"${_ddp_gloo_sdist_sha256}  $HOME/gloo-sdist/${_archive}.tar.gz\" | sha256sum --check\n"
    "       tar -xzf $HOME/gloo-sdist/${_archive}.tar.gz -C $HOME/gloo-sdist\n"
    "     sha256sum must print OK; then:\n"
    "       -DDDP_GLOO_SOURCE_DIR=$HOME/gloo-sdist/${_archive}/third_party/gloo")
endfunction()

if(DDP_GLOO_SOURCE_DIR)
  set(_ddp_gloo_tree ${DDP_GLOO_SOURCE_DIR})
  set(_ddp_gloo_origin "DDP_GLOO_SOURCE_DIR")
else()
  include(FetchContent)
  # SOURCE_SUBDIR names a folder without a CMakeLists.txt: populate only,
  # because Gloo's own build would install and export a shared Gloo, which is
  # what PRIVATE must avoid. NEVER: with FETCHCONTENT_TRY_FIND_PACKAGE_MODE
  # set to ALWAYS, find_package(gloo) could pick Debian's libgloo instead.
  set(FETCHCONTENT_TRY_FIND_PACKAGE_MODE NEVER)
  FetchContent_Declare(gloo
    GIT_REPOSITORY ${_ddp_gloo_git_repository}
    GIT_TAG ${_ddp_gloo_git_commit}
    GIT_SUBMODULES ""
    SOURCE_SUBDIR ddp-compiles-gloo-itself)
  unset(FETCHCONTENT_TRY_FIND_PACKAGE_MODE)

  # FetchContent touches the network only when no tree is named and none was
  # fetched at the pin into this build folder before (a re-configure finds its
  # checkout at the commit and stays offline). Then the remote is tried first,
  # with a deadline, so that an unreachable GitHub gives the message above
  # instead of a clone that hangs or fails in a sub-build's log.
  set(_ddp_gloo_fetched_head "")
  if(EXISTS "${FETCHCONTENT_BASE_DIR}/gloo-src/.git")
    find_package(Git QUIET)
    if(Git_FOUND)
      execute_process(COMMAND ${GIT_EXECUTABLE} -C "${FETCHCONTENT_BASE_DIR}/gloo-src" rev-parse HEAD
        OUTPUT_VARIABLE _ddp_gloo_fetched_head OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    endif()
  endif()
  if(FETCHCONTENT_SOURCE_DIR_GLOO)
    set(_ddp_gloo_origin "FETCHCONTENT_SOURCE_DIR_GLOO")
  elseif(FETCHCONTENT_FULLY_DISCONNECTED)
    set(_ddp_gloo_origin "${FETCHCONTENT_BASE_DIR}/gloo-src, FETCHCONTENT_FULLY_DISCONNECTED")
  elseif(_ddp_gloo_fetched_head STREQUAL _ddp_gloo_git_commit)
    set(_ddp_gloo_origin "commit ${_ddp_gloo_git_commit}, fetched before")
  else()
    find_package(Git QUIET)
    if(NOT Git_FOUND)
      ddp_gloo_source_unavailable("git was not found (set GIT_EXECUTABLE, or install git).")
    endif()
    message(STATUS "ddp: fetching Gloo ${_ddp_gloo_git_commit} (horovod 0.28.1's) from ${_ddp_gloo_git_repository}")
    # GIT_TERMINAL_PROMPT=0: a URL that asks for credentials fails at once.
    execute_process(
      COMMAND ${CMAKE_COMMAND} -E env GIT_TERMINAL_PROMPT=0
              ${GIT_EXECUTABLE} ls-remote ${_ddp_gloo_git_repository} HEAD
      TIMEOUT 30
      RESULT_VARIABLE _ddp_git_rc OUTPUT_QUIET ERROR_VARIABLE _ddp_git_error)
    if(NOT _ddp_git_rc EQUAL 0)
      string(STRIP "${_ddp_git_error}" _ddp_git_error)
      if(_ddp_git_error STREQUAL "")
        set(_ddp_git_error "${_ddp_git_rc}")
      endif()
      ddp_gloo_source_unavailable("could not reach it: `git ls-remote ${_ddp_gloo_git_repository} "
        "HEAD` (30 s allowed) failed: ${_ddp_git_error}")
    endif()
    set(_ddp_gloo_origin "commit ${_ddp_gloo_git_commit}")
  endif()
  FetchContent_MakeAvailable(gloo)
  set(_ddp_gloo_tree ${gloo_SOURCE_DIR})
endif()

# ---- PRIVATE: Gloo's core and TCP transport, compiled hidden ------------------
if(NOT EXISTS "${_ddp_gloo_tree}/gloo/allreduce.cc")
  message(FATAL_ERROR "ddp: '${_ddp_gloo_tree}' (${_ddp_gloo_origin}) is not a Gloo source tree: "
    "it has no gloo/allreduce.cc. Give the folder that holds gloo/allreduce.cc.")
endif()
set(_ddp_gloo_src ${_ddp_gloo_tree}/gloo)
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
  ${PROJECT_BINARY_DIR}/private_gloo/include ${_ddp_gloo_tree})
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
message(STATUS "ddp: Gloo PRIVATE, ${_ddp_gloo_count} files from ${_ddp_gloo_tree} (${_ddp_gloo_origin}), hidden in libddp "
  "(LibTorch exports ${DDP_TORCH_GLOO_EXPORTS} Gloo functions of its own)")
