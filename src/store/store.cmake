# Stores: Store base, HashStore, PrefixStore, FileStore, TCPStore (client,
# server, wire protocol, socket helpers), TorchTCPStore (a client of
# PyTorch's TCPStore server).
#
# DDP_TCP_STORE_SOURCES is the TCPStore alone, with what it needs to link
# against c10 only: the protocol fuzzer (tests/store/fuzz/fuzz.cmake) builds
# from this same list, so that a file added to the server is added there too.
set(DDP_TCP_STORE_SOURCES
  src/store/store.cpp
  src/store/socket.cpp
  src/store/tcp_store.cpp
  src/store/tcp_store_protocol.cpp
  src/store/tcp_store_server.cpp
  src/store/tcp_store_server_epoll.cpp
  src/store/tcp_store_budget.cpp)
ddp_add_part(ddp_stores
  ${DDP_TCP_STORE_SOURCES}
  src/store/hash_store.cpp
  src/store/prefix_store.cpp
  src/store/file_store.cpp
  src/store/torch_tcp_store.cpp)
