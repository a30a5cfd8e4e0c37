# Decides whether the MPI backend is built (DDP_WITH_MPI = AUTO, ON or OFF).
# It needs an MPI library with its headers (Debian: libopenmpi-dev); sets
# DDP_HAVE_MPI and, when set, the INTERFACE target `ddp_mpi_deps` that the
# MPI part and libddp.so link.
#
# Only MPI's C API is used, from C++: MPI_CXX_SKIP_MPICXX keeps the MPI-2 C++
# bindings (deprecated, and a second ABI to match) out of every compile.
set(DDP_HAVE_MPI OFF)
if(NOT DDP_WITH_MPI STREQUAL "OFF")
  set(MPI_CXX_SKIP_MPICXX ON)
  find_package(MPI COMPONENTS CXX QUIET)
  if(MPI_CXX_FOUND)
    set(DDP_HAVE_MPI ON)
    add_library(ddp_mpi_deps INTERFACE)
    target_link_libraries(ddp_mpi_deps INTERFACE MPI::MPI_CXX)
  elseif(DDP_WITH_MPI STREQUAL "ON")
    message(FATAL_ERROR "DDP_WITH_MPI=ON, but no MPI was found: install an MPI with its "
      "headers (Debian: apt-get install libopenmpi-dev openmpi-bin), or point CMake at one "
      "(-DMPI_CXX_COMPILER=/path/to/mpicxx or MPI_HOME), or use DDP_WITH_MPI=AUTO.")
  endif()
endif()
# What the tests and benchmark smoke tests pass to mpiexec: Open MPI's refuses
# to run as root (CI does) without --allow-run-as-root, and --oversubscribe
# lets more ranks than cores start; MPICH's takes neither.
set(DDP_MPIEXEC_FLAGS "")
if(DDP_HAVE_MPI AND MPIEXEC_EXECUTABLE)
  execute_process(COMMAND ${MPIEXEC_EXECUTABLE} --version OUTPUT_VARIABLE _ddp_mpiexec_version
    ERROR_QUIET TIMEOUT 30)
  if(_ddp_mpiexec_version MATCHES "Open MPI|OpenRTE")
    set(DDP_MPIEXEC_FLAGS --allow-run-as-root --oversubscribe)
  endif()
endif()
if(DDP_HAVE_MPI)
  message(STATUS "ddp: MPI backend ON (DDP_WITH_MPI=${DDP_WITH_MPI}; MPI ${MPI_CXX_VERSION}, "
    "${MPIEXEC_EXECUTABLE})")
else()
  message(STATUS "ddp: MPI backend OFF (DDP_WITH_MPI=${DDP_WITH_MPI})")
endif()
