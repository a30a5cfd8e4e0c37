# Stores: Store base, HashStore, PrefixStore, FileStore, TCPStore (client,
# server, wire protocol, socket helpers), TorchTCPStore (a client of
# PyTorch's TCPStore server).
ddp_add_part(ddp_stores
  src/store/store.cpp
  src/store/hash_store.cpp
  src/store/prefix_store.cpp
  src/store/file_store.cpp
  src/store/socket.cpp
  src/store/tcp_store.cpp
  src/store/tcp_store_protocol.cpp
  src/store/tcp_store_server.cpp
  src/store/tcp_store_server_epoll.cpp
  src/store/tcp_store_budget.cpp
  src/store/torch_tcp_store.cpp)
