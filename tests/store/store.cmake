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
ddp_add_gtest(file_store_test
  SOURCES store/file_store_test.cpp
  LIBS ddp_stores ddp_internal
  TIMEOUT 60)
