# tests: install
# Installs this build into a temporary prefix, then builds and runs
# tests/install/consumer, a separate project that only does
# find_package(ddp) and links ddp::ddp, under the installed ddprun (2 ranks)
# and alone. This checks the install rules and the package config, including
# that Torch comes in through it (the LibTorch ddp was built with, not another
# one on the system paths; Gloo stays inside libddp.so). It needs the library and ddprun
# built (the default target builds them); compiling the consumer takes most of
# its time, hence the long timeout.
add_test(NAME install_consumer
  COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/run_install_test.sh
    ${CMAKE_COMMAND} ${PROJECT_BINARY_DIR} ${CMAKE_CURRENT_LIST_DIR}/consumer
    ${CMAKE_CXX_COMPILER})
set_tests_properties(install_consumer PROPERTIES TIMEOUT 600 LABELS "install")
