# tests: store
# The Store contract (store_contract.cpp, once) over every ddp store, then
# each store's own tests; torch_tcp_store_test runs the contract over
# TorchTCPStore too.
ddp_add_gtest(store_test
  SOURCES store/store_test.cpp store/store_contract.cpp
  LIBS ddp_stores ddp_internal
  LABELS integration TIMEOUT 60)
ddp_add_gtest(tcp_store_test
  SOURCES store/tcp_store_test.cpp
  LIBS ddp_stores ddp_internal
  LABELS unit TIMEOUT 60)
# The TCPStore server against hostile clients: handshake, buffer bound,
# deadlines, token. One test forks a server and sends it a few hundred MiB.
ddp_add_gtest(tcp_store_bounds_test
  SOURCES store/tcp_store_bounds_test.cpp
  LIBS ddp_stores ddp_internal
  LABELS integration TIMEOUT 180)
if(DDP_SANITIZE STREQUAL "address")
  # The test bounds the server's resident memory. ASan keeps freed blocks in
  # a quarantine (256 MiB by default) before reusing them, which the server's
  # 64 MiB message buffers fill and which counts as resident: a small one
  # keeps the bound meaningful. The other options are scripts/sanitize.sh's.
  set_tests_properties(tcp_store_bounds_test PROPERTIES
    ENVIRONMENT "ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:quarantine_size_mb=8")
endif()
ddp_add_gtest(file_store_test
  SOURCES store/file_store_test.cpp
  LIBS ddp_stores ddp_internal
  LABELS unit TIMEOUT 60)

# TorchTCPStore against real PyTorch TCPStore servers, which
# torch_store_helper.py starts with DDP_TEST_PYTHON (tests/CMakeLists.txt).
# DDP_TEST_PYTHON in the environment overrides it when the test runs,
# e.g. to test a second PyTorch:
#   DDP_TEST_PYTHON=/path/to/venv/bin/python ctest -R torch_tcp_store_test
# The tests skip only where that interpreter cannot import torch.
ddp_add_gtest(torch_tcp_store_test
  SOURCES store/torch_tcp_store_test.cpp store/store_contract.cpp
  LIBS ddp_stores ddp_internal
  LABELS integration TIMEOUT 300)
target_compile_definitions(torch_tcp_store_test PRIVATE
  DDP_TEST_PYTHON="${DDP_TEST_PYTHON}"
  DDP_TORCH_STORE_HELPER="${CMAKE_CURRENT_LIST_DIR}/torch_store_helper.py")
