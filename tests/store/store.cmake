# tests: store
# The Store contract over every implementation, then each store's own tests.
ddp_add_gtest(store_test
  SOURCES store/store_test.cpp
  LIBS ddp_stores ddp_internal
  TIMEOUT 60)
ddp_add_gtest(tcp_store_test
  SOURCES store/tcp_store_test.cpp
  LIBS ddp_stores ddp_internal
  TIMEOUT 60)
# The TCPStore server against hostile clients: handshake, buffer bound,
# deadlines, token. One test forks a server and sends it a few hundred MiB.
ddp_add_gtest(tcp_store_bounds_test
  SOURCES store/tcp_store_bounds_test.cpp
  LIBS ddp_stores ddp_internal
  TIMEOUT 180)
ddp_add_gtest(file_store_test
  SOURCES store/file_store_test.cpp
  LIBS ddp_stores ddp_internal
  TIMEOUT 60)

# TorchTCPStore against real PyTorch TCPStore servers, which
# torch_store_helper.py starts with DDP_TEST_PYTHON (tests/CMakeLists.txt).
# DDP_TEST_PYTHON in the environment overrides it when the test runs,
# e.g. to test a second PyTorch:
#   DDP_TEST_PYTHON=/path/to/venv/bin/python ctest -R torch_tcp_store_test
# The tests skip only where that interpreter cannot import torch.
ddp_add_gtest(torch_tcp_store_test
  SOURCES store/torch_tcp_store_test.cpp
  LIBS ddp_stores ddp_internal
  TIMEOUT 300)
target_compile_definitions(torch_tcp_store_test PRIVATE
  DDP_TEST_PYTHON="${DDP_TEST_PYTHON}"
  DDP_TORCH_STORE_HELPER="${CMAKE_CURRENT_LIST_DIR}/torch_store_helper.py")
