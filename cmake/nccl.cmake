# Decides whether the NCCL backend is built (DDP_WITH_NCCL = AUTO, ON or OFF).
# It needs a LibTorch built with CUDA and an NCCL library; sets DDP_HAVE_NCCL.
set(DDP_HAVE_NCCL OFF)
if(NOT DDP_WITH_NCCL STREQUAL "OFF")
  set(_ddp_torch_cuda OFF)
  if(TARGET torch_cuda OR TARGET torch::cudart OR TORCH_CUDA_LIBRARIES)
    set(_ddp_torch_cuda ON)
  endif()
  if(_ddp_torch_cuda)
    find_path(NCCL_INCLUDE_DIR nccl.h
      HINTS $ENV{NCCL_ROOT} $ENV{NCCL_HOME} ${NCCL_ROOT} /usr/local/cuda
      PATH_SUFFIXES include)
    # NAMES_PER_DIR: NCCL_ROOT's libnccl.so.2 (a wheel's, which has no
    # libnccl.so link) wins over a libnccl.so found later on the search path.
    find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2 NAMES_PER_DIR
      HINTS $ENV{NCCL_ROOT} $ENV{NCCL_HOME} ${NCCL_ROOT} /usr/local/cuda
      PATH_SUFFIXES lib lib64)
    if(NCCL_INCLUDE_DIR AND NCCL_LIBRARY)
      set(DDP_HAVE_NCCL ON)
      add_library(ddp_nccl_deps INTERFACE)
      target_include_directories(ddp_nccl_deps INTERFACE ${NCCL_INCLUDE_DIR})
      target_link_libraries(ddp_nccl_deps INTERFACE ${NCCL_LIBRARY})
    endif()
  endif()
  if(DDP_WITH_NCCL STREQUAL "ON" AND NOT DDP_HAVE_NCCL)
    message(FATAL_ERROR "DDP_WITH_NCCL=ON, but the NCCL backend cannot be built: "
      "it needs a LibTorch with CUDA (found CUDA: ${_ddp_torch_cuda}) and NCCL "
      "(nccl.h: ${NCCL_INCLUDE_DIR}, library: ${NCCL_LIBRARY}). Set NCCL_ROOT or use DDP_WITH_NCCL=AUTO.")
  endif()
endif()
message(STATUS "ddp: NCCL backend ${DDP_HAVE_NCCL} (DDP_WITH_NCCL=${DDP_WITH_NCCL})")
