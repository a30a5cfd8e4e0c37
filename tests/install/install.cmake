# tests: install
# Installs this build into a temporary prefix, then builds and runs
# tests/install/consumer, a separate project that only does
# find_package(ddp) and links ddp::ddp, under the installed ddprun (2 ranks)
# and alone. This checks the install rules and the package config, including
# that Torch comes in through it (the LibTorch ddp was built with, not another
# one on the system paths; Gloo stays inside libddp.so). It needs the library and ddprun
# built (the default target builds them); compiling the consumer takes most of
# its time, hence the long timeout. The consumer links with this build's
# CMAKE_EXE_LINKER_FLAGS, as a user's project on the same machine would
# (scripts/compat.sh sets them to find a wheel's nvidia-* libraries).
add_test(NAME install_consumer
  COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/run_install_test.sh
    ${CMAKE_COMMAND} ${PROJECT_BINARY_DIR} ${CMAKE_CURRENT_LIST_DIR}/consumer
    ${CMAKE_CXX_COMPILER} "${CMAKE_EXE_LINKER_FLAGS}")
set_tests_properties(install_consumer PROPERTIES TIMEOUT 600 LABELS "install")
