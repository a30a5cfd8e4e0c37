# Integration tests: real processes under ddprun.
ddp_add_launched_test(allreduce_example_4_ranks NPROC 4 COMMAND allreduce_example TIMEOUT 60)
add_test(NAME allreduce_example_alone COMMAND allreduce_example)
set_tests_properties(allreduce_example_alone PROPERTIES TIMEOUT 30
  PASS_REGULAR_EXPRESSION "rank 0 of 1: allreduce gave 1 .*: OK")
