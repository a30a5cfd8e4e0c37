# The libFuzzer target of the TCPStore wire protocol (tcp_store_protocol_fuzz;
# scripts/fuzz.sh builds and runs it). Included by the top-level
# CMakeLists.txt when DDP_BUILD_FUZZERS is ON. It needs a compiler that links
# -fsanitize=fuzzer (clang with its compiler-rt; on Debian: apt-get install
# clang, and libclang-rt-14-dev where the fuzzer runtime is packaged apart);
# with another compiler it is left out, with a warning.
#
# The protocol code and what it links (the store sources, internal.cpp) are
# compiled again here, instrumented for coverage and checked by AddressSanitizer
# and UndefinedBehaviorSanitizer; c10 comes from LibTorch as is.
include(CheckCXXSourceCompiles)
set(CMAKE_REQUIRED_FLAGS "-fsanitize=fuzzer")
check_cxx_source_compiles([[
#include <cstddef>
#include <cstdint>
extern "C" int LLVMFuzzerTestOneInput(const uint8_t*, size_t) { return 0; }
]] DDP_HAVE_LIBFUZZER)
unset(CMAKE_REQUIRED_FLAGS)
if(NOT DDP_HAVE_LIBFUZZER)
  message(WARNING "DDP_BUILD_FUZZERS: ${CMAKE_CXX_COMPILER_ID} ${CMAKE_CXX_COMPILER_VERSION} cannot "
    "link -fsanitize=fuzzer, so no fuzzer is built. Configure with clang "
    "(-DCMAKE_CXX_COMPILER=clang++), as scripts/fuzz.sh does.")
  return()
endif()

set(DDP_FUZZ_SANITIZERS -fsanitize=fuzzer,address,undefined)
# The TCPStore's own files come from src/store/store.cmake's list.
list(TRANSFORM DDP_TCP_STORE_SOURCES PREPEND "${PROJECT_SOURCE_DIR}/" OUTPUT_VARIABLE DDP_FUZZ_STORE_SOURCES)
add_executable(tcp_store_protocol_fuzz
  ${PROJECT_SOURCE_DIR}/tests/store/fuzz/tcp_store_protocol_fuzz.cpp
  ${DDP_FUZZ_STORE_SOURCES}
  ${PROJECT_SOURCE_DIR}/src/internal/internal.cpp)
target_include_directories(tcp_store_protocol_fuzz PRIVATE
  ${PROJECT_SOURCE_DIR}/include ${PROJECT_SOURCE_DIR}/src ${TORCH_INCLUDE_DIRS})
# TORCH_CXX_FLAGS carries LibTorch's _GLIBCXX_USE_CXX11_ABI, which c10::Error's
# std::string members must match.
separate_arguments(DDP_FUZZ_TORCH_FLAGS UNIX_COMMAND "${TORCH_CXX_FLAGS}")
target_compile_options(tcp_store_protocol_fuzz PRIVATE
  ${DDP_FUZZ_TORCH_FLAGS} ${DDP_FUZZ_SANITIZERS} -fno-sanitize-recover=undefined -g -O1)
target_link_options(tcp_store_protocol_fuzz PRIVATE ${DDP_FUZZ_SANITIZERS})
if(TARGET c10)
  target_link_libraries(tcp_store_protocol_fuzz PRIVATE c10 Threads::Threads)
else()
  target_link_libraries(tcp_store_protocol_fuzz PRIVATE ${c10_LIBRARY} Threads::Threads)
endif()
