# Stores: Store base, HashStore, PrefixStore, FileStore, TCPStore (client,
# server, wire protocol, socket helpers).
ddp_add_part(ddp_stores
  src/store/store.cpp
  src/store/hash_store.cpp
  src/store/prefix_store.cpp
  src/store/file_store.cpp
  src/store/socket.cpp
  src/store/tcp_store.cpp
  src/store/tcp_store_server.cpp)
