# Stores: Store base, HashStore, PrefixStore, FileStore, TCPStore (client,
# server, wire protocol, socket helpers).
ddp_add_part(ddp_stores
  src/comm/store.cpp
  src/comm/hash_store.cpp
  src/comm/prefix_store.cpp
  src/comm/file_store.cpp
  src/comm/socket.cpp
  src/comm/tcp_store.cpp
  src/comm/tcp_store_server.cpp)
