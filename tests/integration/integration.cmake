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

# Random faults (scripts/chaos.py, docs/reliability.md "Random faults"):
# mnist_train saving a checkpoint every 3 steps, 2 ranks, while the driver
# kills a random rank at a random moment (SIGKILL, SIGTERM, SIGSTOP then
# SIGKILL, or SIGKILL during a save), a few seeded times: the job must end
# by itself with the final parameters of an uninterrupted run, bit for bit,
# under ddprun --max-restarts and under torchrun's elastic agent (skipped
# when that cannot run). The full runs (30 faults, 3 seeds) are in
# docs/reliability.md.
add_test(NAME mnist_chaos_short
  COMMAND ${DDP_TEST_PYTHON} ${PROJECT_SOURCE_DIR}/scripts/chaos.py --train $<TARGET_FILE:mnist_train>
    --ddprun $<TARGET_FILE:ddprun> --work ${CMAKE_CURRENT_BINARY_DIR}/chaos_work/ddprun --seed 11 --faults 4
    --deadline 200 -- --epochs 3 --train-size 6000 --test-size 200 --lr 0.03)
set_tests_properties(mnist_chaos_short PROPERTIES TIMEOUT 240 LABELS integration)
if(ddp_torchrun)
  set(_ddp_chaos_torchrun ${ddp_torchrun})
else()
  set(_ddp_chaos_torchrun "${DDP_TEST_PYTHON} -m torch.distributed.run")
endif()
add_test(NAME mnist_chaos_short_torchrun
  COMMAND ${DDP_TEST_PYTHON} ${PROJECT_SOURCE_DIR}/scripts/chaos.py --train $<TARGET_FILE:mnist_train>
    --launcher torchrun --torchrun ${_ddp_chaos_torchrun} --work ${CMAKE_CURRENT_BINARY_DIR}/chaos_work/torchrun
    --seed 12 --faults 4 --deadline 200 -- --epochs 3 --train-size 6000 --test-size 200 --lr 0.03)
set_tests_properties(mnist_chaos_short_torchrun PROPERTIES TIMEOUT 240 LABELS integration SKIP_RETURN_CODE 77)
# The same driver against gpt_train with FSDP and activation checkpointing
# (a DCP checkpoint every 3 steps in --checkpoint-dir, resumed from the one
# `latest` names): the step is its position in the data.
add_test(NAME gpt_chaos_short
  COMMAND ${DDP_TEST_PYTHON} ${PROJECT_SOURCE_DIR}/scripts/chaos.py --train $<TARGET_FILE:gpt_train>
    --ddprun $<TARGET_FILE:ddprun> --work ${CMAKE_CURRENT_BINARY_DIR}/chaos_work/gpt --seed 13 --faults 4
    --deadline 200 -- --parallel fsdp --activation-checkpointing --layers 2 --heads 4 --embd 64 --block 64
    --batch 4 --sample 0 --steps 300)
set_tests_properties(gpt_chaos_short PROPERTIES TIMEOUT 240 LABELS integration)

# Two hosts (network namespaces) joined by a link that this machine's
# kernel cannot shape (no netem), so link.py carries its frames: with 50 ms
# each way and 1% loss mnist_train on 2 x 2 ranks trains, slower, to the
# same parameters as over a clean link; with the link taken down mid-step,
# every rank's error names a rank of the other host, within the deadline
# (netem/netem_cases.sh says which checks). Needs root and ip, as
# gloo_shm_hosts does.
ddp_add_output_test(netem_cases EXIT 0 REGEX "^netem_cases: 9 of 9 checks passed$"
  TIMEOUT 240 LABELS integration
  COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/netem/netem_cases.sh $<TARGET_FILE:ddprun> $<TARGET_FILE:mnist_train>
    $<TARGET_FILE:flight_recorder_main> ${DDP_TEST_PYTHON})
