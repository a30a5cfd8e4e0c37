ddp_add_part(ddp_internal src/internal/internal.cpp)
