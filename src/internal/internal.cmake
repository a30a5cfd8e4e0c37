# Private helpers (checks, environment variables, logging) and blas_in_use().
ddp_add_part(ddp_internal src/internal/internal.cpp src/internal/blas.cpp)
