# Integration tests: real processes under ddprun.
ddp_add_launched_test(allreduce_example_4_ranks NPROC 4 COMMAND allreduce_example TIMEOUT 60)
ddp_add_output_test(allreduce_example_alone EXIT 0 REGEX "rank 0 of 1: allreduce gave 1 .*: OK$"
  TIMEOUT 30 LABELS integration COMMAND $<TARGET_FILE:allreduce_example>)

# toy_model under PyTorch's own launcher, torchrun, whose agent serves a
# PyTorch TCPStore at MASTER_ADDR:MASTER_PORT for the ranks (the static
# rendezvous, and the c10d one in recent 2.x releases): init_process_group then
# connects every rank to it (TorchTCPStore). DDP_TEST_TORCHRUN names the
# torchrun; empty means the one next to DDP_TEST_PYTHON, else
# `DDP_TEST_PYTHON -m torch.distributed.run`. The tests skip when that cannot
# run; DDP_TEST_TORCHRUN in the environment overrides the choice at run time.
set(DDP_TEST_TORCHRUN "" CACHE FILEPATH
    "torchrun for the integration tests (empty: the torchrun next to DDP_TEST_PYTHON, else DDP_TEST_PYTHON -m torch.distributed.run)")
set(ddp_torchrun "${DDP_TEST_TORCHRUN}")
if(NOT ddp_torchrun)
  get_filename_component(ddp_python_dir "${DDP_TEST_PYTHON}" DIRECTORY)
  if(EXISTS "${ddp_python_dir}/torchrun")
    set(ddp_torchrun "${ddp_python_dir}/torchrun")
  endif()
endif()
foreach(mode static standalone c10d)
  add_test(NAME toy_model_torchrun_${mode}
    COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/run_torchrun_test.sh
      ${mode} $<TARGET_FILE:toy_model> ${DDP_TEST_PYTHON} ${ddp_torchrun})
  set_tests_properties(toy_model_torchrun_${mode} PROPERTIES
    TIMEOUT 180 LABELS integration SKIP_RETURN_CODE 77)
endforeach()

# torchrun's elastic agent: two agents of one worker each, --nnodes 1:2 with
# the c10d rendezvous, mnist_train resuming from its checkpoints when a node
# is lost, when one joins, and after a crash (--max-restarts);
# torchrun_elastic.sh says which checks. The same torchrun as above.
add_test(NAME torchrun_elastic
  COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/torchrun_elastic.sh $<TARGET_FILE:mnist_train>
    $<TARGET_FILE:ddprun> ${DDP_TEST_PYTHON} ${ddp_torchrun})
set_tests_properties(torchrun_elastic PROPERTIES TIMEOUT 300 LABELS integration SKIP_RETURN_CODE 77)
