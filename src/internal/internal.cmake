# Private helpers (checks, environment variables, logging, the text files
# ddp writes) and blas_in_use().
ddp_add_part(ddp_internal src/internal/internal.cpp src/internal/blas.cpp src/internal/text_files.cpp
  src/internal/json.cpp)
